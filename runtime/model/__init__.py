"""The model: weights, the forward pass, attention and the decode kernel."""
