"""``@checkpoint`` options: when positions are saved and where a stream starts."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, ClassVar

from bson import Timestamp
from pydantic import ValidationInfo, field_validator, model_validator

from flowwarden.checkpoints.store import STORE_METHODS, store_problem
from flowwarden.config.base import Options, option
from flowwarden.config.choices import OnHistoryLost, StartPosition, coerce_choice
from flowwarden.config.problems import OptionProblem


class CheckpointOptions(Options):
    """Options of ``@checkpoint``: when positions are saved and where a stream starts.

    The saved position is the token of the newest event handled with no gap before it; resuming
    from it delivers the next event. ``save_every_n`` events or ``save_interval_seconds``,
    whichever comes first, trigger a save; both 0 saves every event before its commit returns.
    """

    decorator: ClassVar[str] = "checkpoint"

    save_every_n: int = option(
        1,
        "Save the position after this many handled events (the commit waits for it); 0: never by count.",
        ge=0,
    )
    save_interval_seconds: float = option(
        5.0,
        "Save the position (and the last seen token) this often; 0: never by time.",
        ge=0,
        allow_inf_nan=False,
    )
    start_position: StartPosition = option(
        StartPosition.RESUME, "Where a stream with no stored position starts (LATEST: even with one)."
    )
    start_at: datetime | Timestamp | None = option(
        None,
        "With start_position=AT_TIME: the cluster time to start at.",
        allowed="None, or with start_position=AT_TIME a timezone-aware datetime or a bson Timestamp",
    )
    on_history_lost: OnHistoryLost = option(
        OnHistoryLost.FAIL, "What happens when the stored position has left the oplog."
    )
    store: Any = option(
        None,
        "The checkpoint store; None uses the connector's (by default the _fw_checkpoints collection).",
        allowed="None or a checkpoint store instance with methods " + ", ".join(STORE_METHODS),
    )

    @field_validator("start_position", mode="before")
    @classmethod
    def _start_position(cls, value: Any, info: ValidationInfo) -> Any:
        return coerce_choice(StartPosition, value, info.field_name or "")

    @field_validator("on_history_lost", mode="before")
    @classmethod
    def _on_history_lost(cls, value: Any, info: ValidationInfo) -> Any:
        return coerce_choice(OnHistoryLost, value, info.field_name or "")

    @field_validator("start_at")
    @classmethod
    def _start_at(cls, value: datetime | Timestamp | None) -> datetime | Timestamp | None:
        if isinstance(value, datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise OptionProblem(
                    f"start_at={value.isoformat()} has no timezone, so the instant it names is "
                    "ambiguous; pass an aware datetime such as datetime(..., tzinfo=timezone.utc)",
                    option="start_at",
                    value=value,
                    allowed=cls.allowed["start_at"],
                )
            return value.astimezone(timezone.utc)
        return value

    @field_validator("store")
    @classmethod
    def _store(cls, value: Any) -> Any:
        problem = None if value is None else store_problem(value)
        if problem is not None:
            raise OptionProblem(problem, option="store", value=value, allowed=cls.allowed["store"])
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CheckpointOptions:
        if self.start_position is StartPosition.AT_TIME and self.start_at is None:
            raise OptionProblem(
                "start_position=AT_TIME needs start_at= (the cluster time to start from)",
                option="start_at",
                value=None,
                allowed="a timezone-aware datetime or a bson Timestamp",
            )
        if self.start_position is not StartPosition.AT_TIME and self.start_at is not None:
            raise OptionProblem(
                f"start_at is only read with start_position=AT_TIME, not {self.start_position.name}; "
                "set start_position=StartPosition.AT_TIME or drop start_at",
                option="start_at",
                value=self.start_at,
                allowed="None with start_position=" + self.start_position.name,
            )
        return self

    @property
    def start_at_operation_time(self) -> Timestamp | None:
        """``start_at`` as a cluster time for ``start_at_operation_time``.

        A datetime is floored to its second (increment 0), so the stream starts at or before the
        instant given and never skips an event of that second.
        """
        if self.start_at is None or isinstance(self.start_at, Timestamp):
            return self.start_at
        return Timestamp(math.floor(self.start_at.timestamp()), 0)
