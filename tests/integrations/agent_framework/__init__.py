"""Microsoft Agent Framework's tests. No user-agent telemetry and no instrumentation (the fake chat
client calls no service anyway): set before agent_framework is imported by any module of this package."""

import os

os.environ.update(AGENT_FRAMEWORK_USER_AGENT_DISABLED="true", ENABLE_INSTRUMENTATION="false")
