"""The live view's settings for tests: watches that give up, back off and come back in fractions of a second."""

from __future__ import annotations

from gpu_placement.kube.api import WatchSettings

FAST = WatchSettings(connect_timeout=1.0, read_timeout=2.0, server_timeout=30, client_timeout=35.0,
                     backoff_initial=0.05, backoff_max=0.3, page_size=3)
