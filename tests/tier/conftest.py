from __future__ import annotations

import pytest
from redis_util import RedisServer


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
