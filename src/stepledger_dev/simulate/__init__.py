"""``stepledger simulate``: the whole protocol in one process, under one seeded scheduler.

Every high defect of the last adversarial rounds was an interleaving nobody had written a
test for.  The chaos harness (``stepledger chaos``) runs real processes and explores a few
hundred schedules an hour; this explores ~10 a second, replays any of them exactly, and
shrinks a failing one to the few events that show it.

**Actors** (:mod:`.world`, each on the :mod:`.stage` they share).  Agent processes run the
real SDK (``Ledger``, ``Workflow``, settling, compensation, approvals) in three shapes
(:mod:`.agents`: the demo's trip saga, pay-then-notify, and a scripted model driving the
framework integrations' core, ``AgentSteps``); the recovery daemon is the real
``RecoveryDaemon``'s tracker, its arrivals on its own clock, dispatch and Resolver
(:mod:`.daemons`); the projector is its own ``BatchFold``; the checkpointer is the real
``Checkpointer`` over an in-memory checkpoint topic, and readers complete a history
retention shortened through the real ``CheckpointView`` and ``HistoryGuard``
(:mod:`.checkpointing`, :mod:`.stage`, :mod:`.statetopic`); another deployment's
checkpointer may write into the same checkpoint topic (its step log has the same name and
workflow ids, another identity); people answer the human queue through the CLI's
``Answerer``; tool services (:mod:`.services`) count their own effects per logical call.
A killed process never runs again; a new one (a resumed agent, a restarted daemon from its
stored checkpoint) starts later.

**One scheduler** (:mod:`.scheduler`).  The SDK is synchronous and blocking, so each actor
is a thread that runs only while it holds the baton.  Every boundary crossing hands the
baton back: an append (or send, or an acknowledgement's wait), a read, a clock reading, a
sleep, and the crossing *after* a tool call (a call and the checks before it are one
instant; a process can stop with the effect made and no outcome written).  The scheduler
picks the next actor from the seed's generator, so one actor runs at a time and a seed
replays exactly (runner identities are named after their process for the same reason).

**Time** is simulated: the broker's clock is the reference; an actor's wall clock is it
plus the actor's skew; its monotonic clock is simulated time itself.  Time moves between
turns (a few ms), to the next waker when everybody sleeps, never inside a turn.

**The log** (:mod:`.simlog`): partitions keyed by workflow, every record stamped with the
broker's time (``LogAppendTime``) and the actor that wrote it; acknowledgements lost after
the write, refused, or late; duplicate deliveries; bytes from a foreign writer; retention
deleting a partition's head (up to what every reader is past).

**Faults are plan entries** (:mod:`.plan`): freeze an actor for a while, kill it, skew its
clock, lose or delay its next acknowledgement, time its next call out after the effect (or
refuse it), duplicate a record, append a foreign one, delete a partition's head.  A fault
aimed at an actor fires at its n-th crossing or right after its n-th intent or outcome (the
windows the defects lived in); one aimed at the log fires at a turn.  A seed makes a plan
(actors and faults) and picks the interleaving; a plan encodes to one line, so
``--seed S --schedule LINE`` replays it.

**Invariants** (:mod:`.invariants`, :mod:`.liveness`) are checked after every turn:
``effect_once``, ``intent_before_effect``, ``effect_under_open_intent``,
``no_early_decision``, ``compensation_by_owner``, ``approval_covers_call``,
``projection_is_fold``, ``log_isolation`` (nothing of one log applied to another: a handle,
a history read, a checkpoint written), ``no_crash``; and ``decided_within_bound`` once
the run has settled.  A violation stops the run; :mod:`.shrink` drops faults, actors and
variants while the same invariant still breaks, and prints the short trace.

**Seams in the library** (each one small adapter, used everywhere it is needed):

- ``stepledger.timer.Timer``, ``Ledger(timer=...)``: the monotonic clock and sleeps of a
  process.  The runner's budget before a call (``fence.Budget``) and settling's waits read
  it instead of ``time.monotonic``/``time.sleep``.
- ``Ledger(hooks=...)``: the hook pool settling runs recovery hooks on (the Resolver
  already took one); here they run inline, not on pool threads.
- The recovery daemon is driven through what it has: its ``work`` pool, ``fence`` clock,
  the Resolver's ``hooks``, ``confirm`` and ``claimant`` are replaced on the instance; its
  consumer loop is the actor's (one poll per crossing).  A compensation's claim is read back
  from the log (the whole workflow), where the daemon's claim board answers from its
  tracker's fold once its loop read the claim.
- The checkpointer's producer and log-start client are replaced on the instance; the
  checkpoint view's two consumer factories are pointed at memory topics for a run; its
  consumer loop is the actor's.  The runner identity function
  (``fence.new_runner``) is replaced during a run, for deterministic ids.

**Test-only switches** (:mod:`.defects`) put a fixed defect's old behaviour back, so the
tests prove the simulator re-finds it; ``python -m stepledger_dev.simulate --defect NAME``.

**Not simulated (yet)**: consumer-group rebalances between several daemons; the asyncio
paths (``astep``, ``aworkflow``); the projector's DuckDB store and its restore of a gap
from checkpoints; compaction of the checkpoint topic (readers take each key's newest
record, as after compaction); the recovery daemon's changelog state.
"""
