"""Test-wide settings: hypothesis profiles (ci is the default; HYPOTHESIS_PROFILE=thorough
runs many more examples locally)."""

import atexit
import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "thorough",
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# imported programs are cached on disk (program.cache): the suite keeps its own, empty at the start
if "SHARDLAYOUT_CACHE_DIR" not in os.environ:
    os.environ["SHARDLAYOUT_CACHE_DIR"] = tempfile.mkdtemp(prefix="shardlayout-cache-")
    atexit.register(shutil.rmtree, os.environ["SHARDLAYOUT_CACHE_DIR"], True)
