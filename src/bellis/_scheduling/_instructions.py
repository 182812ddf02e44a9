"""The instructions the dispatcher gives the shell, sans I/O.

:class:`~bellis._scheduling._dispatch.Dispatcher` appends them to its ``out`` list and the
shell (``bellis._run._server``) carries them out in order, reading each by field name:
``instr.op`` says which one it is (mypy narrows the :data:`Instruction` union on it).

Each is a ``NamedTuple`` whose first field is its opcode, so it still compares equal to the
plain tuple ``(op, *fields)``: ``(CLOSE, peer)`` is ``Close(CLOSE, peer)``.

=============  ==========================================  ===============================
opcode         instruction                                 the shell
=============  ==========================================  ===============================
SEND_FRAME     :class:`SendFrame` ``(op, peer, frame)``    queues the frame on the socket
CLOSE          :class:`Close` ``(op, peer)``               closes the connection
LAUNCH         :class:`Launch` ``(op, plan, bookings)``    starts the booked workers
KILL           :class:`Kill` ``(op, worker)``              kills the worker's process
PROGRESS       :class:`Progress` ``(op,)``                 tells the progress observers
=============  ==========================================  ===============================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal, NamedTuple

if TYPE_CHECKING:
    from ._records import Booking, ManagedWorker, Peer, TaskRecord

__all__ = [
    "CLOSE",
    "KILL",
    "LAUNCH",
    "PROGRESS",
    "SEND_FRAME",
    "Close",
    "Instruction",
    "Kill",
    "Launch",
    "Progress",
    "SendFrame",
]

SEND_FRAME: Final = 0
CLOSE: Final = 1
LAUNCH: Final = 2
KILL: Final = 3
PROGRESS: Final = 4


class SendFrame(NamedTuple):
    """Send ``frame`` (a complete encoded frame) to ``peer``. The dispatcher builds this
    one once per batch sent, with ``tuple.__new__`` (see ``_dispatch._send_frame``)."""

    op: Literal[0]
    peer: Peer
    frame: bytes


class Close(NamedTuple):
    """Close ``peer``'s connection (the dispatcher has let go of it already)."""

    op: Literal[1]
    peer: Peer


class Launch(NamedTuple):
    """Start the workers ``bookings`` of ``plan``'s task, then report each one to
    ``Dispatcher.launched`` or ``Dispatcher.launch_failed``."""

    op: Literal[2]
    plan: TaskRecord
    bookings: list[Booking]


class Kill(NamedTuple):
    """Kill ``worker``'s process (the dispatcher has retired it already)."""

    op: Literal[3]
    worker: ManagedWorker


class Progress(NamedTuple):
    """Tell the progress observers that the run changed."""

    op: Literal[4]


#: any instruction: narrow it on ``instr.op``
Instruction = SendFrame | Close | Launch | Kill | Progress
