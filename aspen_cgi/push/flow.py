"""One push, in stock receive-pack's order: read commands (a signed push's
certificate too) and push options, take the pack into a quarantine (with
the client's shallow commits, when it pushes from a shallow clone:
push/shallow.py), check connectivity and hidden refs, run pre-receive,
migrate, hand the refs receive.procReceiveRefs names to the proc-receive
hook (procreceive.py), check and update each other ref (update hook, new
shallow roots, CAS through update-ref), report, then post-receive,
post-update, gc --auto and update-server-info. Output is produced as a
stream of response chunks."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Generator, Iterator, Optional

from ..git import gitexec
from ..git.gitexec import GitEnv
from ..git.hooks import Hooks
from ..git.reader import object_info
from ..model.objectid import is_null
from ..model.refname import check_refname_format
from ..model.refs import HiddenRefs, namespace_prefix
from ..protocol import pktline, push
from ..protocol.pktline import ProtocolError
from ..protocol.procreceive import RefReport
from ..protocol.push import ZERO, Command, RefResult
from ..refstore import db as store_db
from ..refstore import hookruns
from ..refstore.registry import packs_dir_of, push_pack_store, replica_mode, sent_pack_path
from ..runtime.owners import fault
from ..service import ServiceRefused
from . import autogc, deploy, intake, procreceive
from . import policy as pol
from . import shallow as shallowpush
from .refwrite import RefChange, VersionMeta, in_process_ok, transaction

if TYPE_CHECKING:
    from .signed import Certificate


KEEPALIVE = b"0005\x01"   # an empty band-1 packet: "still working"


class _Phases:
    """A push's time by phase, written to its trace (`phases=intake:40,refs:12,...`) as each ends."""

    def __init__(self, trace):
        self.trace = trace
        self.last = time.perf_counter()
        self.done: list[str] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.done.append(f"{name}:{(now - self.last) * 1000:.1f}")
        self.last = now
        self.trace["phases"] = ",".join(self.done)


@dataclass
class CommandState:
    cmd: Command
    index: int = 0
    error: Optional[str] = None
    did_not_exist: bool = False
    skip_update: bool = False          # never checked nor updated (shallow update not allowed)
    proc: bool = False                 # the proc-receive hook's (run_proc_receive)
    proc_returned: bool = False        # ... and it reported on it
    reports: tuple[RefReport, ...] = ()   # what the hook said the ref became

    @property
    def pending(self) -> bool:
        """should_process_cmd(): neither failed nor skipped."""
        return self.error is None and not self.skip_update


def _read_exact(body, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = body.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


class Push:
    def __init__(self, ctx, body):
        self.ctx = ctx
        self.body = body
        self.gitdir = ctx.gitdir
        self.policy = pol.PushPolicy.from_config(ctx.config)
        self.hooks = Hooks(ctx.gitdir, ctx.config, ctx.log)
        self.prefix = namespace_prefix(ctx.namespace)
        self.env = GitEnv(ctx.env)     # the children's: GIT_SHALLOW_FILE added for a shallow update
        self.shallow: Optional[shallowpush.ShallowPush] = None
        self.walked: set[str] = set()  # the tips the connectivity walk listed the new objects of
        self.quarantine: Optional[intake.Quarantine] = None
        self.msgs = push.Messages(False, ctx.log)
        self.keep_file: Optional[str] = None
        self.replica_packs: tuple[str, ...] = ()    # the pack store's copy of the pack (a replica's push)
        self.sent = None       # packs.sentpack.SentPack
        self.new_commits: dict[str, tuple[str, ...]] = {}
        self.new_objects: Optional[dict[str, str]] = None     # the connectivity walk's other objects and paths
        self.new_times: dict[str, int] = {}                     # the new commits' committer times
        self.ff_known: dict[tuple[str, str], bool] = {}
        self.nonce: Optional[str] = None      # issued as receive-pack issues one, as it starts
        if ctx.config.has("receive.certnonceseed"):
            from .signed import NoncePolicy  # startup: signed pushes' modules only where they are on
            self.nonce = NoncePolicy.from_config(ctx.config).issue()
        self.cert: Optional["Certificate"] = None
        import uuid  # startup: only pushes pay for it
        self.push_id = uuid.uuid4().hex

    # -- the response stream -------------------------------------------------

    def run(self) -> Iterator[bytes]:
        started = False
        try:
            for chunk in self._run():
                if chunk:
                    started = True
                    yield chunk
        except GeneratorExit:
            raise
        except ProtocolError as e:
            if not started:
                raise
            self.ctx.log.append(f"fatal: {e}\n")     # where git dies (a hand-made certificate): said on band 3
            if self.msgs.sideband:
                yield push.band(3, f"fatal: {e}\n".encode("utf-8", "replace"))
        except Exception:
            if not started:
                raise
            self.ctx.log.append("aspen: receive-pack failed after the response began\n" + traceback.format_exc())
            if self.msgs.sideband:
                yield push.band(3, b"fatal: internal error in receive-pack\n")
        finally:
            self._cleanup()
            if self.shallow is not None:
                self.shallow.remove()

    def _cleanup(self) -> None:
        """Drop an unmigrated quarantine, the .keep that guarded a migrated pack,
        and the client's pack kept for a version that did not land."""
        if self.sent is not None:
            self.sent.discard()
            self.sent = None
        if self.quarantine is not None:
            self.quarantine.remove()
            self.quarantine = None
        if self.keep_file:
            try:
                os.unlink(self.keep_file)
            except OSError:
                pass
            self.keep_file = None

    def _relay(self, gen):
        """Relay a child's output (band 2 or the log), with a keepalive for
        each idle interval when side-band is on; return the child's result."""
        while True:
            try:
                chunk = next(gen)
            except StopIteration as stop:
                return stop.value
            if chunk is None:
                if self.msgs.sideband:
                    yield KEEPALIVE
                continue
            out = self.msgs.frame(chunk)
            if out:
                yield out

    @property
    def idle(self) -> float:
        return float(self.policy.keepalive) if self.policy.keepalive > 0 else 0

    def _run(self) -> Iterator[bytes]:
        if self.policy.refused:
            # stock's receive-pack dies reading such a configuration (a 200 with an empty body)
            raise ServiceRefused(500, "Internal Server Error", f"fatal: {self.policy.refused}")
        reader = pktline.Reader(self.body)
        req = push.read_commands(reader)
        if not req.commands:
            return
        neg = push.negotiate(req, self.policy.advertise_atomic, self.policy.advertise_push_options,
                             self.policy.object_format)
        if neg.push_options:
            req = replace(req, push_options=push.read_push_options(reader))
        self.neg = neg
        self.msgs.sideband = neg.sideband
        self.ctx.trace["commands"] = len(req.commands)
        if req.cert is not None:
            from .signed import Certificate, NoncePolicy  # startup
            self.cert = Certificate(req.cert, NoncePolicy.from_config(self.ctx.config), self.nonce, self.ctx.config,
                                    self.gitdir, self.ctx.env, self.ctx.log)

        unpack_error = None
        states = [CommandState(c, i) for i, c in enumerate(req.commands)]
        self.clock = _Phases(self.ctx.trace)
        if not req.delete_only:
            self.shallow = shallowpush.prepare(self.gitdir, self.ctx.env, req.shallow) if req.shallow else None
            unpack_error = yield from self._unpack()
            if unpack_error is None and self.shallow is not None:
                self._assign_shallow(states)
        fault("after-intake", self.ctx.env)
        if self.cert is not None and not self.cert.options_agree(req.push_options):
            for s in states:
                s.error = "inconsistent push options"
        self.clock.lap("intake")
        yield from self._execute(states, unpack_error, req.push_options)
        self.clock.lap("refs")
        if self.sent is not None and any(s.error is None for s in states):
            self.sent.keep(self._listing(states))
            self.sent = None
            self._adopt_sent()
            self.clock.lap("adopt")
        self._cleanup()

        results = [RefResult(s.cmd.ref, s.error, s.reports) for s in states]
        ng = sum(1 for r in results if r.error is not None)
        self.ctx.trace["push"] = f"ok={len(results) - ng},ng={ng}"
        if neg.report_status or neg.report_status_v2:
            rep = push.report(unpack_error, results, v2=neg.report_status_v2)
            yield push.band(1, rep) if neg.sideband else rep
        fault("reported", self.ctx.env)
        ok = [s for s in states if s.error is None and not s.did_not_exist]
        if ok:
            env = self._hook_env(req.push_options, quarantine=False)
            yield from self._relay(self.hooks.run("post-receive", [], env, self._post_receive_input(ok), self.idle,
                                                  self._cert_env))
            yield from self._relay(self.hooks.run("post-update", [s.cmd.ref for s in ok], self.env, idle=self.idle))
        if self.policy.auto_gc and autogc.needed(self.gitdir, self.ctx.config):
            res = gitexec.git(["gc", "--auto", "--quiet"], cwd=self.gitdir, env=self.ctx.env)
            yield self.msgs.frame(res.stdout + res.stderr)
        if self.policy.update_server_info:
            gitexec.git(["update-server-info"], cwd=self.gitdir, env=self.ctx.env)
        if ok:
            self._background_work()
        self.clock.lap("after")
        if neg.sideband:
            yield pktline.FLUSH

    def _adopt_sent(self) -> None:
        """The client's pack becomes its version's pack now, before the report,
        when that needs no git (packs.background.adopt_now)."""
        from ..packs import background  # startup: pushes without a store never load the builder
        store = self.ctx.refstore()
        if store is not None:
            t0 = time.perf_counter()
            adopted = background.adopt_now(store)
            self.ctx.trace["adopted"] = f"{'yes' if adopted else 'no'},{(time.perf_counter() - t0) * 1000:.1f}ms"

    def _background_work(self) -> None:
        """After a push landed: its version pack (when built), then the jobs
        the request's composer registered (ServiceContext.after_push: pre-warm,
        the bundle kept current)."""
        from ..packs import background  # startup: pushes without a store never load the builder
        store = self.ctx.refstore()
        if store is None:
            return
        if background.enabled(self.ctx.settings):
            background.kick(self.ctx.repository, store.packs_dir)
        for job in self.ctx.after_push:
            job(self.gitdir, self.ctx.env, background.IN_PROCESS)

    # -- pack intake ------------------------------------------------------------

    def _unpack(self) -> Generator[bytes, None, Optional[str]]:
        raw = _read_exact(self.body, 12)
        header = push.parse_pack_header(raw)
        if isinstance(header, str):
            return header
        try:
            self.quarantine = intake.Quarantine(self.gitdir)
        except OSError:
            return "unable to create temporary object directory"
        p = self.policy
        opts = intake.IntakeOptions(fsck=p.fsck, fsck_msg_types=p.fsck_msg_types, max_input_size=p.max_input_size,
                                    unpack_limit=p.unpack_limit, progress=self.neg.sideband and not self.neg.quiet,
                                    quiet=self.neg.quiet, shallow_file=self.shallow.temp if self.shallow else None)
        self.ctx.trace["objects"] = header.entries
        self.sent = self._keep_sent(raw)
        upload = None
        if replica_mode(self.ctx.settings):
            try:
                upload = push_pack_store(self.ctx.repository).upload()
            except OSError as e:
                self.ctx.log.append(f"aspen: {e}\n")
                self.quarantine.remove()
                self.quarantine = None
                return "the pack store cannot be written"
            upload.write(raw)
        res = yield from self._relay(intake.unpack(self.quarantine, self.gitdir, self.ctx.env, header,
                                                   self.body.read, opts, self.idle, self._tee(upload)))
        if res.error is None and upload is not None:
            try:     # before any ref is committed: an acknowledged push's objects are in the pack store
                sha256 = (self.ctx.config.get("extensions.objectformat") or "").lower() == "sha256"
                self.replica_packs = (upload.finish(32 if sha256 else 20),)
            except OSError as e:
                self.ctx.log.append(f"aspen: {e}\n")
                res = intake.UnpackResult("the pack store cannot be written", res.keep)
            else:
                res = self._replicate(upload.directory, self.replica_packs[0], res)
        elif upload is not None:
            upload.discard()
        if res.error:
            self.quarantine.remove()
            self.quarantine = None
        self.keep_file = res.keep
        return res.error

    def _replicate(self, directory: str, name: str, res):
        """Packs between nodes (ASPEN_NODE_URL): the push's pack on ASPEN_REPLICAS
        nodes before any ref is committed, or the push fails."""
        s = self.ctx.settings
        if not s.node_url:
            return res
        from ..refstore import peers  # startup: a cluster's nodes only
        try:
            peers.replicate(s, os.path.basename(directory), name, os.path.join(directory, name), self.ctx.log.append)
        except (store_db.Error, store_db.Busy):
            return res      # the log is unreachable too: the push is refused when its refs are committed
        except OSError as e:
            self.ctx.log.append(f"aspen: {e}; push refused\n")
            return intake.UnpackResult("the pack could not be kept on enough nodes", res.keep)
        return res

    def _tee(self, upload):
        """Where the client's pack bytes go besides index-pack: the kept sent pack, the pack store."""
        sent = self.sent
        if upload is None:
            return sent.write if sent else None
        if sent is None:
            return upload.write

        def both(chunk: bytes) -> None:
            sent.write(chunk)
            upload.write(chunk)
        return both

    def _listing(self, states: list[CommandState]):
        """What the connectivity walk found new, when the push was one ref's update:
        then it is its version's N_v and objects (sentpack.Listing), for adopt().
        Not with alternates: the walk left out what their refs reach, which no
        version of this repository holds."""
        from ..packs.sentpack import Listing  # startup
        if len(states) != 1 or states[0].cmd.is_delete or self.new_objects is None:
            return None
        if states[0].cmd.new not in self.walked:      # a shallow update: checked with its own roots
            return None
        if os.path.exists(os.path.join(self.gitdir, "objects", "info", "alternates")):
            return None
        return Listing((states[0].cmd.new,), self.new_commits, self.new_objects, self.new_times)

    def _keep_sent(self, header: bytes):
        """The client's pack, kept for its version's build when version packs are on.
        The store is not opened here: the push opens it where it may wait for it."""
        from ..packs import background  # startup
        from ..packs.sentpack import SentPack  # startup
        packs = packs_dir_of(self.ctx.repository) if background.enabled(self.ctx.settings) else None
        if packs is None:
            return None
        return SentPack.start(packs, sent_pack_path(packs, self.push_id), header)

    def _qenv(self) -> dict:
        return self.quarantine.env(self.env) if self.quarantine else dict(self.env)

    def _assign_shallow(self, states: list[CommandState]) -> None:
        """update_shallow_info(): which refs need new shallow roots; refused
        unless receive.shallowUpdate, else the later children see the
        temporary shallow file."""
        sp = self.shallow
        assert sp is not None                   # the caller's condition
        shallowpush.assign(sp, self._qenv(), {s.index: s.cmd.new for s in states if not s.cmd.is_delete})
        if not sp.active:
            return
        if self.policy.shallow_update:
            self.env = shallowpush.child_env(sp, self.env)
            return
        for s in states:
            if s.index in sp.needs:
                s.error, s.skip_update = "shallow update not allowed", True

    def _shallow_checked_later(self, s: CommandState) -> bool:
        """A ref whose new roots update_shallow_ref() checks, not the common walk."""
        return self.policy.shallow_update and self.shallow is not None and s.index in self.shallow.needs

    # -- execute_commands() ---------------------------------------------------------

    def _execute(self, states: list[CommandState], unpack_error: Optional[str],
                 push_options: tuple[str, ...]) -> Iterator[bytes]:
        if unpack_error:
            for s in states:
                s.error = "unpacker error"
            return
        yield from self._connectivity(states)
        self.clock.lap("check")
        self._reject_hidden(states)
        self._mark_proc_receive(states)
        env = self._hook_env(push_options, quarantine=True)
        rc = yield from self._relay(self.hooks.run("pre-receive", [], env, self._hook_input(states), self.idle,
                                                   self._cert_env))
        if rc != 0:
            for s in states:
                if s.error is None:
                    s.error = "pre-receive hook declined"
            return
        if all(s.error is not None for s in states):
            return
        fault("after-hooks", self.ctx.env)
        if self.quarantine is not None:
            if not self.quarantine.migrate():
                for s in states:
                    if s.error is None:
                        s.error = "unable to migrate objects to permanent storage"
                return
            self.quarantine = None
        self.clock.lap("migrate")
        self.states = states
        # new commits are known to exist and to be commits; anything else is asked of git once
        self.info: dict[str, tuple[str, Optional[str]]] = {c: ("commit", None) for c in self.new_commits}
        self.worktrees = pol.checked_out(self.gitdir, pol.is_bare(self.ctx.config), self.ctx.config)
        self.head_name = pol.head_name(self.gitdir)
        if any(s.proc for s in states):
            yield from self._proc_receive(states, push_options)
        if self.neg.atomic:
            yield from self._atomic(states)
        else:
            yield from self._non_atomic(states)

    def _connectivity(self, states: list[CommandState]) -> Iterator[bytes]:
        tips = [s.cmd.new for s in states
                if not s.cmd.is_delete and not s.skip_update and not self._shallow_checked_later(s)]
        env = self._qenv()
        progress = self.msgs.sideband and not self.neg.quiet
        known = self._known_tips()
        res = intake.connected(self.gitdir, env, tips, progress=progress, with_commits=True,
                               exclude=known[0] if known else None)
        if known and (not res.ok or known[1].intersection(res.objects or ())):
            # a tip the store knows is gone, or the push names a tag a ref holds: walk as git does
            res = intake.connected(self.gitdir, env, tips, progress=progress, with_commits=True)
        yield self.msgs.frame(res.stderr)
        if res.ok:
            self.new_commits = res.commits or {}
            self.new_objects = res.objects
            self.new_times = res.times or {}
            self.walked = set(tips)
            return
        for s in states:
            if s.cmd.is_delete or self._shallow_checked_later(s):
                continue
            single = intake.connected(self.gitdir, env, [s.cmd.new])
            if not single.ok:
                self.ctx.log.append(single.stderr.decode("utf-8", "replace"))
                s.error = "missing necessary objects"

    def _known_tips(self) -> Optional[tuple[list[str], set[str]]]:
        """What --all names, from the ref store: every ref's peeled value (and
        a detached HEAD's), with the tag objects refs hold, which --all would
        keep out of the listing and peeled values do not. None without a store,
        or when the repository borrows objects (alternates' refs are git's)."""
        if os.path.exists(os.path.join(self.gitdir, "objects", "info", "alternates")):
            return None
        store = self._open_store()
        if store is None:
            return None
        try:
            snap = store.snapshot(None)
        except (store_db.Error, store_db.Busy):
            return None
        refs = list(snap.refs) + ([snap.head] if snap.head is not None and snap.head_target is None else [])
        peeled = {r.peeled or r.oid for r in refs if not r.missing}
        tags = {r.oid for r in refs if r.peeled and r.peeled != r.oid}
        return sorted(peeled), tags

    def _mark_proc_receive(self, states: list[CommandState]) -> None:
        pats = self.policy.proc_receive_refs
        if not pats:
            return
        cmds = [(s.cmd.old, s.cmd.new, s.cmd.ref) for s in states]
        for s, mine in zip(states, procreceive.handled_by_hook(pats, cmds, [s.pending for s in states])):
            s.proc = mine

    def _reject_hidden(self, states: list[CommandState]) -> None:
        hidden = HiddenRefs.from_config(self.ctx.config, "receive")
        if not hidden:
            return
        for s in states:
            if s.error is None and hidden.hidden(s.cmd.ref, self.prefix + s.cmd.ref):
                s.error = "deny deleting a hidden ref" if s.cmd.is_delete else "deny updating a hidden ref"

    def _hook_input(self, states: list[CommandState]) -> bytes:
        return "".join(f"{s.cmd.old} {s.cmd.new} {s.cmd.ref}\n" for s in states).encode("utf-8", "surrogateescape")

    def _post_receive_input(self, states: list[CommandState]) -> bytes:
        """feed_receive_hook() after the updates: a ref the proc-receive hook
        reported on is given as each of its reports says it became."""
        lines = []
        for s in states:
            c = s.cmd
            if not s.reports:
                lines.append(f"{c.old} {c.new} {c.ref}\n")
            for r in s.reports:
                ref = r.ref_name if r.ref_name is not None else c.ref
                lines.append(f"{r.old_oid or c.old} {r.new_oid or c.new} {ref}\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    def _hook_env(self, push_options: tuple[str, ...], quarantine: bool) -> dict:
        env = self._qenv() if quarantine else dict(self.env)
        for i, opt in enumerate(push_options):
            env[f"GIT_PUSH_OPTION_{i}"] = opt
        env["GIT_PUSH_OPTION_COUNT"] = str(len(push_options))
        return env

    def _cert_env(self) -> dict[str, str]:
        return self.cert.hook_env() if self.cert is not None else {}

    # -- the proc-receive hook ------------------------------------------------------

    def _proc_receive(self, states: list[CommandState], push_options: tuple[str, ...]) -> Iterator[bytes]:
        """run_proc_receive_hook(): the hook takes its refs; what it reported is
        each one's result, and what it wrote to the refs is recorded as a
        version of this push."""
        store = self._open_store()
        req = procreceive.Request(tuple((s.cmd.old, s.cmd.new, s.cmd.ref) for s in states),
                                  tuple(s.proc and s.pending for s in states), self.neg.atomic,
                                  self.neg.push_options, push_options)
        with hookruns.Mark(os.path.dirname(store.path)) if store is not None else contextlib.nullcontext():
            out = yield from self._relay(procreceive.run(self.hooks, self.gitdir, self.env, req, self.idle,
                                                         self.ctx.log))
            yield from self._proc_results(states, out)
            self._record_hook_changes(store)

    def _proc_results(self, states: list[CommandState], out) -> Iterator[bytes]:
        if out.message:
            yield self.msgs.error(out.message)
        for s, c in zip(states, out.commands):
            s.proc, s.proc_returned, s.reports = c.handled, c.returned, c.reports
            if c.error is not None:
                s.error = c.error
        if not out.ok:
            for s in states:
                if s.error is None and not s.proc_returned and (s.proc or self.neg.atomic):
                    s.error = "fail to run proc-receive hook"
        self.ctx.trace["proc_receive"] = "ok" if out.ok else "failed"

    def _open_store(self):
        """The ref store, brought up to the disk now (None without one)."""
        with store_db.patience(store_db.store_wait(self.ctx.settings)):
            return self.ctx.refstore()

    def _record_hook_changes(self, store) -> None:
        """The refs the hook changed on disk, as one version of this push."""
        if store is None:
            return
        meta = VersionMeta("push", self.ctx.request.user, self.push_id)
        try:
            with store_db.patience(store_db.store_wait(self.ctx.settings)):
                before = store.version
                if store_db.retry(lambda: store.sync(meta)) != before:
                    self.ctx.trace["pushed_versions"] = self.ctx.trace.get("pushed_versions", 0) + 1
        except (store_db.Error, store_db.Busy, OSError) as e:
            self.ctx.log.append(f"aspen: ref store unavailable after the proc-receive hook ({e}); "
                                "the next request records what it changed\n")

    # -- per-ref updates ----------------------------------------------------------

    def _non_atomic(self, states: list[CommandState]) -> Iterator[bytes]:
        for s in states:
            if not s.pending or s.proc:
                continue
            upd: list[RefChange] = []
            s.error = yield from self._update(s, upd)
            if s.error is None:
                err = self._commit(upd)
                if err:
                    yield self.msgs.error(err)
                    s.error = "failed to update ref"

    def _atomic(self, states: list[CommandState]) -> Iterator[bytes]:
        reported = "atomic push failure"
        upd: list[RefChange] = []
        failed = False
        for s in states:
            if not s.pending or s.proc:
                continue
            s.error = yield from self._update(s, upd)
            if s.error is not None:
                failed = True
                break
        if not failed:
            err = self._commit(upd)
            if err:
                yield self.msgs.error(err)
                reported, failed = "atomic transaction failed", True
        if failed:
            for s in states:
                if s.error is None:
                    s.error = reported

    def _commit(self, upd: list[RefChange]) -> Optional[str]:
        introduced: set[str] = set()
        for c in upd:
            if not is_null(c.new):
                introduced.update(intake.reachable_new(self.new_commits, c.new))
        meta = VersionMeta("push", self.ctx.request.user, self.push_id, tuple(sorted(introduced)),
                           self.cert.record() if self.cert is not None else None, self.replica_packs)
        fast = in_process_ok(self.ctx.config, pol.is_bare(self.ctx.config))
        # a ref store locked by another process is waited for up to ASPEN_STORE_WAIT (then git alone writes)
        with store_db.patience(store_db.store_wait(self.ctx.settings)):
            return transaction(self.ctx.refstore(), self.ctx.repository, upd, meta, self.ctx.log, fast,
                               self.ctx.trace)

    def _lookup(self, oid: str) -> tuple[str, Optional[str]]:
        """(type or "missing", peeled) of OID; the first unknown one fetches all the push's unknowns."""
        if oid not in self.info:
            unknown = sorted({o for s in self.states for o in (s.cmd.new, s.cmd.old)
                              if not is_null(o) and o not in self.info} | {oid})
            self.info.update(object_info(self.gitdir, self.env, unknown))
            for o in unknown:
                self.info.setdefault(o, ("missing", None))
        return self.info[oid]

    def _type(self, oid: str) -> Optional[str]:
        t = self._lookup(oid)[0]
        return None if t == "missing" else t

    def _fast_forward(self, old: str, new: str) -> bool:
        if is_null(old) or is_null(new):
            return False
        known = intake.fast_forward(self.new_commits, old, new)
        if known is not None:
            return known
        if (old, new) not in self.ff_known:
            if self._type(old) != "commit" or self._type(new) != "commit":
                self.ff_known[(old, new)] = False
            else:
                self.ff_known[(old, new)] = intake.is_ancestor(self.gitdir, self.env, old, new)
        return self.ff_known[(old, new)]

    def _update(self, s: CommandState, upd: list[RefChange]) -> Generator[bytes, None, Optional[str]]:
        """update(): the checks of one command, its update hook, and its queued ref change."""
        m = self.msgs
        c = s.cmd
        name = c.ref
        if not name.startswith("refs/") or not check_refname_format(name[5:]) or not c.utf8_ref:
            yield m.error(f"refusing to create funny ref '{name}' remotely")
            return "funny refname"
        full = self.prefix + name
        worktree = self.worktrees.get(name)
        update_worktree = False
        if worktree is not None:
            deny = self.policy.deny_current_branch
            if deny == pol.WARN:
                yield m.warning("updating the current branch")
            elif deny in (pol.REFUSE, pol.UNCONFIGURED):
                yield m.error(f"refusing to update checked out branch: {name}")
                if deny == pol.UNCONFIGURED:
                    yield m.error(pol.REFUSE_CURRENT_MSG)
                return "branch is currently checked out"
            elif deny == pol.UPDATE_INSTEAD:
                update_worktree = True
        if not c.is_delete and self._type(c.new) is None:
            self.ctx.log.append(f"error: unpack should have generated {c.new}, but I can't find it!\n")
            return "bad pack"
        if not is_null(c.old) and c.is_delete:
            if self.policy.deny_deletes and name.startswith("refs/heads/"):
                yield m.error(f"denying ref deletion for {name}")
                return "deletion prohibited"
            if worktree is not None or (self.head_name is not None and full == self.head_name):
                deny = self.policy.deny_delete_current
                if deny == pol.WARN:
                    yield m.warning("deleting the current branch")
                elif deny != pol.IGNORE:
                    if deny == pol.UNCONFIGURED:
                        yield m.error(pol.REFUSE_DELETE_CURRENT_MSG)
                    yield m.error(f"refusing to delete the current branch: {name}")
                    return "deletion of the current branch prohibited"
        if (self.policy.deny_non_fast_forwards and not c.is_delete and not c.is_create
                and name.startswith("refs/heads/")):
            if self._type(c.old) != "commit" or self._type(c.new) != "commit":
                self.ctx.log.append(f"error: bad sha1 objects for {name}\n")
                return "bad ref"
            if not self._fast_forward(c.old, c.new):
                yield m.error(f"denying non-fast-forward {name} (you should pull first)")
                return "non-fast-forward"
        rc = yield from self._relay(self.hooks.run("update", [name, c.old, c.new], self.env, idle=self.idle))
        if rc != 0:
            yield m.error(f"hook declined to update {name}")
            return "hook declined"
        if update_worktree:
            assert worktree is not None                 # update_worktree is set only with one
            err = deploy.update_worktree(self.hooks, self.env, c.new, worktree, self.ctx.log)
            if err:
                return err
        if c.is_delete:
            old: Optional[str] = c.old
            if self._type(c.old) is None:
                old = None
                if intake.ref_exists(self.gitdir, self.env, full):
                    yield m.warning("allowing deletion of corrupt ref")
                else:
                    yield m.warning("deleting a non-existent ref")
                    s.did_not_exist = True
            upd.append(RefChange(full, old, ZERO))
        else:
            if self._shallow_checked_later(s):
                assert self.shallow is not None         # _shallow_checked_later() said so
                res = shallowpush.add_roots(self.shallow, self.env, s.index, c.new)
                if res.log:
                    self.ctx.log.append(res.log)
                if not res.ok:
                    if res.message:
                        yield m.error(res.message)
                    return "shallow error"
            otype, peeled = self._lookup(c.new)
            upd.append(RefChange(full, c.old, c.new, self._fast_forward(c.old, c.new), otype, peeled))
        return None
