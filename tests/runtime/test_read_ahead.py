"""ReadAhead: the change stream read one batch ahead, in order, bounded, errors in their place."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowwarden.runtime.read_ahead import EmptyRead, FailedRead, ReadAhead


class ScriptedStream:
    """try_next() plays a script: dicts are events, None an empty read, an exception is raised.
    Every try_next yields to the loop once, like a getMore would."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.calls = 0
        self.alive = True
        self.resume_token: dict[str, Any] | None = {"_data": "00"}

    async def try_next(self) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        if not self.script:
            self.alive = False
            return None
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        if item is None:
            self.resume_token = {"_data": f"{self.calls:02d}"}
        return item


async def drain(reader: ReadAhead, count: int) -> list[Any]:
    out = []
    for _ in range(count):
        out.append(reader.items.popleft() if reader.items else await reader.wait())
    return out


def test_events_empty_reads_and_the_end_arrive_in_stream_order() -> None:
    async def main() -> list[Any]:
        stream = ScriptedStream([{"n": 1}, None, {"n": 2}])
        reader = ReadAhead(stream, limit=10)
        try:
            return await drain(reader, 4)
        finally:
            await reader.close(timeout=2.0)

    first, empty, second, end = asyncio.run(main())
    assert first == {"n": 1} and second == {"n": 2}
    assert isinstance(empty, EmptyRead) and empty.alive and empty.token == {"_data": "02"}
    assert isinstance(end, EmptyRead) and not end.alive


def test_an_error_comes_after_the_events_read_before_it_and_ends_the_reading() -> None:
    boom = RuntimeError("getMore failed")

    async def main() -> tuple[list[Any], int]:
        stream = ScriptedStream([{"n": 1}, {"n": 2}, boom, {"n": 3}])
        reader = ReadAhead(stream, limit=10)
        try:
            items = await drain(reader, 3)
            await asyncio.sleep(0.01)
            return items, stream.calls
        finally:
            await reader.close(timeout=2.0)

    items, calls = asyncio.run(main())
    assert items[:2] == [{"n": 1}, {"n": 2}]
    assert isinstance(items[2], FailedRead) and items[2].error is boom
    assert calls == 3  # nothing read after the error


def test_the_reader_pauses_at_the_limit_and_goes_on_when_the_queue_empties() -> None:
    async def main() -> tuple[int, int, list[Any]]:
        stream = ScriptedStream([{"n": i} for i in range(10)])
        reader = ReadAhead(stream, limit=3)
        try:
            await asyncio.sleep(0.01)
            paused_at = stream.calls
            waiting = len(reader.items)
            items = await drain(reader, 10)
            return paused_at, waiting, items
        finally:
            await reader.close(timeout=2.0)

    paused_at, waiting, items = asyncio.run(main())
    assert (paused_at, waiting) == (3, 3)
    assert items == [{"n": i} for i in range(10)]


def test_close_stops_a_read_in_flight_and_drops_what_was_not_taken() -> None:
    async def main() -> tuple[int, int]:
        stream = ScriptedStream([{"n": i} for i in range(100)])
        reader = ReadAhead(stream, limit=5)
        await asyncio.sleep(0.01)
        await reader.close(timeout=2.0)
        calls = stream.calls
        await asyncio.sleep(0.01)
        return calls, len(reader.items) + stream.calls - calls

    calls, after = asyncio.run(main())
    assert calls == 5 and after == 0


def test_waiting_on_a_reader_that_ended_without_a_last_item_raises() -> None:
    class Broken(ScriptedStream):
        async def try_next(self) -> Any:
            raise asyncio.CancelledError  # ends the task without a FailedRead

    async def main() -> None:
        reader = ReadAhead(Broken([]), limit=5)
        await asyncio.sleep(0.01)
        try:
            with pytest.raises(RuntimeError, match="ended without a last item"):
                await reader.wait()
        finally:
            await reader.close(timeout=2.0)

    asyncio.run(main())


def test_close_abandons_a_reader_whose_cancelled_read_waits_for_a_server_that_is_gone() -> None:
    """What PyMongo's change stream does when its read is cancelled: it closes its cursor before
    it ends, and closing waits for a server, for as long as server selection lasts. The close
    does not wait for that: it abandons the reader, whose second cancellation ends the wait."""

    class Unreachable(ScriptedStream):
        def __init__(self) -> None:
            super().__init__([])
            self.closing = asyncio.Event()

        async def try_next(self) -> Any:
            try:
                await asyncio.Event().wait()  # a getMore that no server answers
            except BaseException:
                self.closing.set()
                await asyncio.Event().wait()  # closing the cursor: no server to select
                raise
            return None

    async def main() -> tuple[float, bool, list[asyncio.Task[Any]], list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        stream = Unreachable()
        reader = ReadAhead(stream, limit=5)
        await asyncio.sleep(0.01)
        started = loop.time()
        try:
            await asyncio.wait_for(reader.close(timeout=0.2), 10)
            took = loop.time() - started
            await asyncio.sleep(0.01)
            left = [t for t in asyncio.all_tasks() if t.get_name() == "flowwarden-read-ahead"]
        finally:  # a close that waited: the reader is still closing, and would hold asyncio.run
            for task in asyncio.all_tasks():
                if task.get_name() == "flowwarden-read-ahead":
                    task.cancel()
        return took, stream.closing.is_set(), left, errors

    took, closing, left, errors = asyncio.run(main())
    assert closing, "the read was cancelled, and its stream began closing"
    assert 0.2 <= took < 5
    assert left == [], "the abandoned reader ends once cancelled again"
    assert errors == []
