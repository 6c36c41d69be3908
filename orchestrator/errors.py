"""One error family for everything the user (or agent) can get wrong.

Every ``OrchestratorError`` has a stable snake_case ``code`` and the CLI exit code it maps
to. Messages name the culprit and say what to do next. Any other exception is a bug and
is re-raised with its traceback.
"""

from __future__ import annotations

# Exit codes of the CLI (design.md).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_HUMAN = 3
EXIT_AGENT = 4
EXIT_JOB = 5


class OrchestratorError(Exception):
    """Base class: ``code`` is stable for machines, the message is for people."""

    code = "error"
    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class UsageError(OrchestratorError):
    """Bad input: unknown workflow or run, malformed option or answer. Nothing written."""

    code = "bad_input"


class RunNotFound(UsageError):
    code = "run_not_found"


class RunBusy(UsageError):
    code = "run_busy"


class TrailCorrupt(UsageError):
    """events.jsonl is missing, truncated or does not parse: refuse to act on the run."""

    code = "trail_corrupt"


class RunIsFinished(UsageError):
    """The run is done or aborted; it takes no further command (not the ``run_finished`` event)."""

    code = "run_finished"


class RecordInvalid(OrchestratorError):
    """A phase added a record its workflow's table types otherwise (``Workflow.records``): a bug to fix there."""

    code = "record_invalid"
    exit_code = EXIT_FAILED


class BadAnswer(UsageError):
    code = "bad_answer"


class WorkflowDefinitionError(OrchestratorError):
    """A workflow table is inconsistent; lists every problem at once."""

    code = "workflow_definition"
    exit_code = EXIT_FAILED


class RuleBroken(OrchestratorError):
    """A guard found the target in a state the skill forbids (e.g. edits outside scope)."""

    code = "rule_broken"
    exit_code = EXIT_FAILED


class WorkerFailed(OrchestratorError):
    """A worker subprocess crashed, timed out or wrote no answer."""

    code = "worker_failed"
    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, log: str = "", status: str = "failed") -> None:
        super().__init__(message)
        self.log = log
        self.status = status
