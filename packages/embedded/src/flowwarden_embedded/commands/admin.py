"""Server administration: ``getCmdLineOpts``, ``getParameter``/``setParameter`` and
``configureFailPoint``.

``setParameter`` and ``configureFailPoint`` change server-wide state, so, as on MongoDB, they run
only against the ``admin`` database; ``configureFailPoint`` is never itself failed by a fail point.
"""

from __future__ import annotations

from flowwarden_embedded.commands.arguments import GENERIC_FIELDS
from flowwarden_embedded.commands.registry import Context, command
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.storage import Document


@command("getCmdLineOpts", sessions=False)
async def cmd_get_cmd_line_opts(ctx: Context) -> Document:
    process = ctx.conn.process
    port = process.port
    argv = [process.role.value, "--bind_ip", "127.0.0.1", "--port", str(port)]
    parsed: Document = {"net": {"bindIp": "127.0.0.1", "port": port}}
    if process.set_name is not None:
        argv[1:1] = ["--replSet", process.set_name]
        parsed["replication"] = {"replSet": process.set_name}
        if ctx.host.mongos is not None:
            argv.insert(1, "--shardsvr")
            parsed["sharding"] = {"clusterRole": "shardsvr"}
    parsed["setParameter"] = {"enableTestCommands": "1"}
    return {"argv": argv, "parsed": parsed, "ok": 1.0}


@command("getParameter", sessions=False)
async def cmd_get_parameter(ctx: Context) -> Document:
    params = ctx.host.parameters
    if ctx.cmd.get("getParameter") == "*" or ctx.cmd.get("allParameters"):
        return {**params, "ok": 1.0}
    wanted = [k for k in ctx.cmd if k not in GENERIC_FIELDS and k != "getParameter"]
    if not wanted:
        raise CommandError(72, "no option found to get", code_name="InvalidOptions")
    reply: Document = {}
    for name in wanted:
        if name not in params:
            raise CommandError(72, "no option found to get", code_name="InvalidOptions")
        reply[name] = params[name]
    reply["ok"] = 1.0
    return reply


@command("setParameter", sessions=False)
async def cmd_set_parameter(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "setParameter may only be run against the admin database.", code_name="Unauthorized"
        )
    params = ctx.host.parameters
    reply: Document = {}
    changed = [k for k in ctx.cmd if k not in GENERIC_FIELDS and k != "setParameter"]
    if not changed:
        raise CommandError(2, "no option found to set, use help:true to see options ")
    for name in changed:
        if name not in params or name in ("featureCompatibilityVersion",):
            raise CommandError(
                2, f"attempted to set unrecognized parameter [{name}], use help:true to see options "
            )
        reply["was"] = params[name]
        params[name] = ctx.cmd[name]
    reply["ok"] = 1.0
    return reply


@command("configureFailPoint", failable=False, sessions=False)
async def cmd_configure_fail_point(ctx: Context) -> Document:
    if ctx.db != "admin":
        raise CommandError(
            13, "configureFailPoint may only be run against the admin database.", code_name="Unauthorized"
        )
    # Each process has its own fail points, as each MongoDB process does: one set through the
    # mongos fails what the mongos receives, one set on the shard what clients send the shard.
    reply = ctx.conn.process.failpoints.configure(ctx.cmd)
    reply["ok"] = 1.0
    return reply
