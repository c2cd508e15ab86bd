"""How fast change events become Spark DataFrames, and how fast the streaming source reads.

On the same batch of change events (default 100,000; 60% inserts, 30% updates with
updateLookup, 10% deletes), in one run and one local SparkSession, for two schemas (the default
Extended JSON ``full_document`` and a pydantic model typing it as a struct):

- by hand: build a list of dicts (what users write) and ``spark.createDataFrame(rows, schema)``,
  starting from the decoded dicts PyMongo hands users; decoding them is not counted, which
  favours this variant;
- flowwarden: ``events_to_dataframe(spark, events, schema=...)`` (column-wise through Arrow),
  starting from the raw BSON of the same events (``RawBSONDocument(bson.encode(event))``,
  built once outside the timed region: what a change stream read with
  ``document_class=RawBSONDocument`` delivers). With the compiled converter built
  (``flowwarden.spark.convert.native.AVAILABLE``) those bytes go straight to Arrow buffers; without it
  they are decoded and converted in Python, inside the timed region;
- ceiling: ``spark.createDataFrame(table, schema)`` of an already-built Arrow table of the same
  data (what ingestion costs with no conversion at all).

Every DataFrame is fully materialised by a ``noop`` write, so each figure covers the rows
actually reaching Spark's executors, not a lazy plan. The runs take turns in rounds, after
``--warmup`` untimed ones, in an order that rotates each round, and each one's best run counts:
first ``--arrow-repeat`` rounds of the flowwarden and ceiling runs (the two the 1.5x target
compares, by the median over the rounds of each round's two runs' ratio, with its quartiles and
range and the ratio of the two bests),
then ``--repeat`` rounds of the by-hand runs, which are kept apart because they leave the JVM
full of row objects that slow whatever runs next. Before each run (outside the timed region)
both garbage collectors run, Python's and the JVM's, so no run pays for the garbage of the one
before, and then the benchmark waits ``--settle`` seconds (default 0.5): the JVM keeps working
on its own threads for a while after a full collection, and on a 2-core machine that work
lands on whichever run comes next (it made the conversion's time vary by +-70%).
``--show-rounds`` prints every round's time of the Arrow runs.

Then ``events_to_arrow`` alone on the typed batch where 1 document in 1,000 does not fit the
schema (the compiled converter leaves those events to Python), against the same batch that fits
and against the whole batch in Python. Then, end to end from the change stream to a noop sink
with an EmbeddedReplicaSet in its own process (``benchmarks/spark_end_to_end.py``, which also runs
on its own): a hand-written loop, ``@on_dataframe``, a no-op ``@on_change`` and the streaming
source, on ``--e2e-events`` inserts.

Prints plain figures and ratios; asserts nothing. Run:

    .venv/bin/python benchmarks/spark.py            # full run
    .venv/bin/python benchmarks/spark.py --events 5000 --e2e-events 5000 --repeat 1 --arrow-repeat 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import random
import statistics
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import bson
from bson import Decimal128, ObjectId, Timestamp, json_util
from bson.raw_bson import RawBSONDocument
from pydantic import BaseModel, Field

from flowwarden.spark import (
    ObjectIdStr,
    change_event_struct_type,
    events_to_arrow,
    events_to_dataframe,
    get_or_create_session,
    register,
)
from flowwarden.spark.convert import native
from flowwarden.spark.convert.extjson import JSON_OPTIONS, JsonMode


class Item(BaseModel):
    sku: str
    qty: int
    price: float


class Address(BaseModel):
    city: str
    zip: str


class Order(BaseModel):
    id: ObjectIdStr = Field(alias="_id")
    customer: str
    status: str
    amount: Decimal = Field(max_digits=12, decimal_places=2)
    qty: int
    created: dt.datetime
    items: list[Item]
    tags: list[str]
    address: Address


def make_events(count: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    base = dt.datetime(2024, 1, 1)
    events: list[dict[str, Any]] = []
    for i in range(count):
        oid = ObjectId()
        doc = {
            "_id": oid,
            "customer": f"customer-{rng.randrange(5000)}",
            "status": rng.choice(["new", "paid", "shipped", "cancelled"]),
            "amount": Decimal128(f"{rng.randrange(1, 100000)}.{rng.randrange(100):02d}"),
            "qty": rng.randrange(1, 20),
            "created": base + dt.timedelta(milliseconds=rng.randrange(10**10)),
            "items": [
                {
                    "sku": f"sku-{rng.randrange(1000)}",
                    "qty": rng.randrange(1, 5),
                    "price": rng.randrange(100, 9999) / 100,
                }
                for _ in range(rng.randrange(1, 4))
            ],
            "tags": rng.sample(["gift", "express", "b2b", "promo", "fragile"], 2),
            "address": {
                "city": rng.choice(["Paris", "Lyon", "Oslo", "Porto"]),
                "zip": f"{rng.randrange(10000, 99999)}",
            },
        }
        roll = rng.random()
        event: dict[str, Any] = {
            "_id": {
                "_data": f"82{1_700_000_000 + i // 10:08X}{i % 10 + 1:08X}2B042C0100296E5A1004{i:032X}04"
            },
            "clusterTime": Timestamp(1_700_000_000 + i // 10, i % 10 + 1),
            "wallTime": base + dt.timedelta(seconds=i // 10, milliseconds=i % 10),
            "ns": {"db": "shop", "coll": "orders"},
            "documentKey": {"_id": oid},
        }
        if roll < 0.6:
            event.update(operationType="insert", fullDocument=doc)
        elif roll < 0.9:
            event.update(
                operationType="update",
                fullDocument=doc,
                updateDescription={
                    "updatedFields": {"status": doc["status"], "amount": doc["amount"]},
                    "removedFields": ["promo"],
                    "truncatedArrays": [],
                },
            )
        else:
            event.update(operationType="delete")
        events.append(event)
    return events


# ----------------------------------------------------------------------------------------------
# What users write by hand: one dict per event, then createDataFrame(list_of_dicts, schema).

_CANONICAL = JSON_OPTIONS[JsonMode.CANONICAL]


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return json_util.dumps(value, json_options=_CANONICAL, separators=(",", ":"), ensure_ascii=False)


def _typed(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    return {
        "id": str(doc["_id"]),
        "customer": doc["customer"],
        "status": doc["status"],
        "amount": doc["amount"].to_decimal(),
        "qty": doc["qty"],
        "created": doc["created"].replace(tzinfo=dt.timezone.utc),
        "items": [dict(item) for item in doc["items"]],
        "tags": list(doc["tags"]),
        "address": dict(doc["address"]),
    }


def by_hand(events: list[dict[str, Any]], typed: bool) -> list[dict[str, Any]]:
    document = _typed if typed else _json
    rows = []
    for event in events:
        update = event.get("updateDescription")
        to = event.get("to") or {}
        rows.append(
            {
                "_id": event["_id"]["_data"],
                "operation_type": event["operationType"],
                "cluster_time": dt.datetime.fromtimestamp(event["clusterTime"].time, dt.timezone.utc),
                "cluster_time_increment": event["clusterTime"].inc,
                "wall_time": event["wallTime"].replace(tzinfo=dt.timezone.utc),
                "database": event["ns"]["db"],
                "collection": event["ns"]["coll"],
                "to_database": to.get("db"),
                "to_collection": to.get("coll"),
                "document_key": _json(event["documentKey"]),
                "full_document": document(event.get("fullDocument")),
                "full_document_before_change": document(event.get("fullDocumentBeforeChange")),
                "updated_fields": _json(update["updatedFields"]) if update else None,
                "removed_fields": update["removedFields"] if update else None,
                "truncated_arrays": (
                    [{"field": t["field"], "new_size": t["newSize"]} for t in update["truncatedArrays"]]
                    if update
                    else None
                ),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------


def timed_rounds(
    repeat: int, warmup: int, settle: Callable[[], None], *runs: Callable[[], None]
) -> list[list[float]]:
    """The times of each run in ``repeat`` timed rounds, after ``warmup`` untimed ones (the
    JVM compiles Spark's Arrow and row paths over the first rounds: each run gets faster for
    several rounds before it settles). The runs take turns, so load from other processes on
    the machine weighs on all of them alike rather than on whichever ran during a busy moment,
    and their order rotates by one each round, so no run always follows the same one (a run
    right after the by-hand ones finds the JVM busiest; one right after another Arrow ingestion
    finds its code warm). ``settle`` runs before each run, untimed."""
    times: list[list[float]] = [[] for _ in runs]
    for round_ in range(warmup + repeat):
        for turn in range(len(runs)):
            index = (turn + round_) % len(runs)
            settle()
            start = time.perf_counter()
            runs[index]()
            if round_ >= warmup:
                times[index].append(time.perf_counter() - start)
    return times


def materialise(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def line(label: str, count: int, seconds: float) -> str:
    return f"  {label:<52} {count / seconds:>10,.0f} events/s {seconds:8.3f} s"


def variant(
    spark: Any,
    events: list[dict[str, Any]],
    rounds: tuple[int, int, int],
    pause: float,
    label: str,
    schema: Any,
    show_rounds: bool = False,
) -> None:
    repeat, arrow_repeat, warmup = rounds
    count = len(events)
    struct = change_event_struct_type(schema)
    typed = schema is not None
    raw_events = [RawBSONDocument(bson.encode(event)) for event in events]
    table = events_to_arrow(raw_events, schema=schema).table
    rows = by_hand(events, typed)

    def hand() -> None:
        materialise(spark.createDataFrame(by_hand(events, typed), struct))

    def hand_prebuilt_rows() -> None:
        materialise(spark.createDataFrame(rows, struct))

    def flowwarden() -> None:
        materialise(events_to_dataframe(spark, raw_events, schema=schema).dataframe)

    def ceiling() -> None:
        materialise(spark.createDataFrame(table, struct))

    def arrow_only() -> None:
        events_to_arrow(raw_events, schema=schema)

    def settle() -> None:
        gc.collect()
        spark.sparkContext._jvm.System.gc()
        time.sleep(pause)

    # The Arrow runs first, in rounds of their own: a by-hand run leaves the JVM with gigabytes
    # of row objects and recompiled row paths, which slows whichever Arrow run comes next by
    # up to a third. The two rows the 1.5x target compares run under the same conditions.
    arrow_times = timed_rounds(arrow_repeat, warmup, settle, flowwarden, ceiling, arrow_only)
    hand_times = timed_rounds(repeat, warmup, settle, hand, hand_prebuilt_rows)
    t_fw, t_ceiling, t_arrow = map(min, arrow_times)
    t_hand, t_rows = map(min, hand_times)
    # Spark's ingestion time moves by +-30% from one run to the next on a small shared machine,
    # in both runs alike, and now and then one run is much luckier than all the others: the
    # ratio of two bests pits the ceiling's luckiest run against flowwarden's. The median of
    # the ratios of each round's two runs, taken side by side, is the steadier figure; both
    # are printed.
    ratios = sorted(fw / ceil for fw, ceil in zip(arrow_times[0], arrow_times[1], strict=True))
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    print(
        f"\n{label}: {count:,} change events, each materialised by a noop write; best of "
        f"{arrow_repeat} rounds (Arrow runs) and {repeat} rounds (by hand), each after {warmup} "
        "warm-up rounds"
    )
    print(line("by hand: dicts per event + createDataFrame(rows, schema)", count, t_hand))
    print(line("  of which createDataFrame(prebuilt rows, schema)", count, t_rows))
    print(line("flowwarden: events_to_dataframe (raw BSON events)", count, t_fw))
    print(line("  of which events_to_arrow", count, t_arrow))
    print(line("ceiling: createDataFrame(prebuilt Arrow table, schema)", count, t_ceiling))
    if show_rounds:
        for name, series in zip(("flowwarden", "ceiling", "events_to_arrow"), arrow_times, strict=True):
            print(f"    rounds, {name}: " + " ".join(f"{t:.3f}" for t in series))
    print(f"  flowwarden vs by hand: {t_hand / t_fw:.2f}x faster (target >= 3)")
    print(f"  flowwarden time / ceiling time, median of the rounds: {quartiles[1]:.2f} (target <= 1.5)")
    print(
        f"    quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}; "
        f"ratio of the two bests {t_fw / t_ceiling:.2f}"
    )


def conversion(
    spark: Any, events: list[dict[str, Any]], rounds: tuple[int, int, int], pause: float, show_rounds: bool
) -> None:
    variant(spark, events, rounds, pause, "Extended JSON full_document (default)", None, show_rounds)
    variant(spark, events, rounds, pause, "full_document typed by a pydantic model", Order, show_rounds)
    misfits(events, rounds[1], rounds[2])


def misfits(events: list[dict[str, Any]], repeat: int, warmup: int, every: int = 1000) -> None:
    """events_to_arrow of the typed batch when one document in ``every`` does not fit the
    schema (``qty`` holds a string): the compiled converter leaves those events to Python and
    converts the rest; the whole batch in Python is the reference (from decoded dicts, decoding
    not counted)."""
    dirty = []
    for i, event in enumerate(events):
        if i % every == every // 2 and "fullDocument" in event:
            event = {**event, "fullDocument": {**event["fullDocument"], "qty": "three"}}
        dirty.append(event)
    clean_raw = [RawBSONDocument(bson.encode(event)) for event in events]
    dirty_raw = [RawBSONDocument(bson.encode(event)) for event in dirty]
    malformed = len(events_to_arrow(dirty_raw, schema=Order).malformed)

    def clean() -> None:
        events_to_arrow(clean_raw, schema=Order)

    def with_misfits() -> None:
        events_to_arrow(dirty_raw, schema=Order)

    def in_python() -> None:
        events_to_arrow(dirty, schema=Order)

    t_clean, t_dirty, t_python = map(
        min, timed_rounds(repeat, warmup, gc.collect, clean, with_misfits, in_python)
    )
    count = len(events)
    print(
        f"\nfull_document typed, {malformed:,} of {count:,} documents do not fit the schema "
        f"(PERMISSIVE), events_to_arrow only, best of {repeat} rounds"
    )
    print(line("raw events, every document fits", count, t_clean))
    print(line(f"raw events, 1 in {every:,} does not fit", count, t_dirty))
    print(line("decoded events, the whole batch in Python", count, t_python))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--e2e-events", type=int, default=50_000, help="inserts read end to end")
    parser.add_argument("--e2e-rounds", type=int, default=3, help="rounds of the end-to-end runs")
    parser.add_argument(
        "--e2e-warmup", type=int, default=1, help="untimed rounds of the end-to-end runs first (default 1)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed by-hand rounds (default 3)")
    parser.add_argument(
        "--arrow-repeat", type=int, default=15, help="timed rounds of the Arrow runs (default 15)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument(
        "--settle", type=float, default=0.5, help="seconds to wait after the collections before each run"
    )
    parser.add_argument("--show-rounds", action="store_true", help="print each round's times")
    parser.add_argument("--skip-end-to-end", action="store_true")
    args = parser.parse_args()

    spark = get_or_create_session(
        "local[2]",
        app_name="flowwarden-benchmark",
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    converter = "compiled" if native.AVAILABLE else "Python (flowwarden.spark.convert._native is not built)"
    print(f"flowwarden Spark benchmark: Spark {spark.version}, master {spark.sparkContext.master}")
    print(f"raw-event converter: {converter}")
    conversion(
        spark,
        make_events(args.events),
        (args.repeat, args.arrow_repeat, args.warmup),
        args.settle,
        args.show_rounds,
    )
    if not args.skip_end_to_end:
        from spark_end_to_end import end_to_end, inserted_documents

        end_to_end(
            spark, inserted_documents(args.e2e_events), args.e2e_rounds, 10_000, [], args.e2e_warmup
        )
    spark.stop()


if __name__ == "__main__":
    main()
