"""Long hardening runs (`make stress`): fuzz, soak, tenant isolation through timing."""
