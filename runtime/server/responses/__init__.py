"""OpenAI's Responses API (`/v1/responses`): request models so far; routes, store and stream to come
(issue 35)."""
