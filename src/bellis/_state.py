"""TaskState: a frozen snapshot of one task's counters (daisy's ``TaskState``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "TaskState"]

#: The block timeout of a task that passes none (daisy 2.0.0's default). Every module that
#: needs it imports it from here: the task, the launchers, the summary and the abandonment
#: message.
DEFAULT_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class TaskState:
    """Counters of one task at one moment.

    Invariant: ``total_block_count == ready + processing + completed + failed + orphaned
    + pending``. ``completed_count`` includes ``skipped_count``.
    """

    task_id: str = ""
    started: bool = False
    total_block_count: int = 0
    ready_count: int = 0
    processing_count: int = 0
    completed_count: int = 0
    skipped_count: int = 0
    failed_count: int = 0
    orphaned_count: int = 0
    worker_failure_count: int = 0
    worker_restart_count: int = 0
    worker_start_count: int = 0
    abandoned: bool = False
    abandon_reason: str | None = None
    first_worker_error: str | None = None
    last_worker_error: str | None = None
    timeout_reclaim_count: int = 0
    timeout_secs: float = DEFAULT_TIMEOUT_SECONDS
    skipped_done_count: int = 0
    skipped_mask_count: int = 0
    skipped_check_count: int = 0
    failed_attempt_count: int = 0
    stall_reclaim_count: int = 0
    stall_timeout_secs: float | None = None
    backups_started: int = 0
    backups_won: int = 0
    backups_lost: int = 0
    backup_loser_seconds: float = 0.0
    #: how coherent the workers' streams of blocks were (distributed runs,
    #: ``_scheduling/_locality``): blocks handed to a worker after its first, those of
    #: them that were a grid neighbour of the worker's previous block, and the sum of
    #: their grid distances to it (Chebyshev, in blocks)
    locality_blocks: int = 0
    locality_local: int = 0
    locality_steps: int = 0
    #: the same at the level of chunks (tasks with ``inputs``, serial and distributed):
    #: the chunks of declared inputs that blocks read, and those of them their worker
    #: had read already, for an earlier block (served from its chunk cache)
    chunk_reads: int = 0
    chunk_hits: int = 0
    #: out-of-memory retries (``Task(memory_limit=...)``, ``SlurmLauncher(mem=...)``): in
    #: all, and per grant they ran with as ``(("600M", 2), ...)``
    oom_retry_count: int = 0
    oom_retries: tuple[tuple[str, int], ...] = ()
    #: blocks that succeeded after an out-of-memory death, per grant they succeeded with
    oom_successes: tuple[tuple[str, int], ...] = ()
    #: blocks that ran out of memory at the largest grant (failed for good)
    oom_failure_count: int = 0
    #: the task's own span (UNIX seconds): its first block sent and its last block
    #: returned in this run; None when no block ran (or came back without its times)
    first_sent_at: float | None = None
    last_returned_at: float | None = None

    @property
    def task_wall_seconds(self) -> float | None:
        """The task's own wall time: from its first block sent to its last returned."""
        if self.first_sent_at is None or self.last_returned_at is None:
            return None
        return max(0.0, self.last_returned_at - self.first_sent_at)

    @property
    def pending_count(self) -> int:
        return (
            self.total_block_count
            - self.ready_count
            - self.processing_count
            - self.completed_count
            - self.failed_count
            - self.orphaned_count
        )

    def is_done(self) -> bool:
        """True when every block is completed, failed or orphaned."""
        return (
            self.completed_count + self.failed_count + self.orphaned_count == self.total_block_count
        )

    def __repr__(self) -> str:
        return "\n".join(
            [
                f"Started: {str(self.started).lower()}",
                f"Total Blocks: {self.total_block_count}",
                f"Ready: {self.ready_count}",
                f"Processing: {self.processing_count}",
                f"Pending: {self.pending_count}",
                f"Completed: {self.completed_count}",
                f"Skipped: {self.skipped_count}",
                f"Failed: {self.failed_count}",
                f"Orphaned: {self.orphaned_count}",
            ]
        )
