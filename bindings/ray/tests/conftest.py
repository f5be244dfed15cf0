"""A Ray cluster on this machine, with emulated TPU slices as its nodes.

Nothing may contact a network host: Ray's auth token and usage stats are
off, and Ray's lookup of the cloud metadata server (what it does for a TPU
node whose TPU_* variables are missing) fails the test instead of running.
"""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
# The host actors' torch must not autoload another device backend.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import pytest  # noqa: E402
import ray  # noqa: E402
import ray._private.accelerators.tpu as ray_tpu  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

METADATA_QUERIES = []


def _no_metadata_server(key):
    METADATA_QUERIES.append(key)
    raise AssertionError(f"Ray tried to ask the TPU metadata server for {key!r}: a TPU_* variable is missing")


ray_tpu._get_tpu_metadata = _no_metadata_server


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
    assert METADATA_QUERIES == []
