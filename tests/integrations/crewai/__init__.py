"""CrewAI's tests. No telemetry or tracing leaves the machine: CrewAI reads these when it is imported,
and this package is imported before any of its modules (the child app's included)."""

import os

os.environ.update(
    OTEL_SDK_DISABLED="true",
    CREWAI_DISABLE_TELEMETRY="true",
    CREWAI_DISABLE_TRACKING="true",
    CREWAI_TRACING_ENABLED="false",
)
