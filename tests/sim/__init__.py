"""Deterministic simulation of the saver's operations (design.md, "Proving it").

Every public method of ``S3Saver`` builds an operation (a generator of waves of
calls) and hands it to a driver. The harness takes that generator through the
public method (``world.capture``), drives it itself, one call at a time, and
interleaves the calls of several operations on one Python thread, with faults
(lost replies, requests never sent, processes cut short and retried by a fresh
saver). A reference model (LangGraph's ``InMemorySaver`` plus what it lacks)
says what the final state may be: some order of the operations that respects
real time (linearizability).

Modules:
    world:     the moto server seen one call at a time; the capture seam.
    scheduler: processes, steps, faults, choosers (random or exhaustive).
    model:     the reference model and the linearizability search.
    workload:  realistic checkpoints and the scenarios (operation pairs).
    check:     what is read back after a schedule, and every assertion.
    runner:    one schedule end to end; budgets, summaries, replay commands.
    failover:  two regions (replication, an outage, promote, failback): their world and schedules.
    committed: the two-region schedules' reference (what each region committed) and checks.
"""
