"""Requests of one engine call that share a prefix, read as one job.

Applications ask several things about one state in separate requests, often at once (a
workflow's stages, an agent's checks): queued together, they reach the engine in the
same call. Their jobs have the same prefix (BOS, instructions, text), so the engine
call gets one job with every request's branches, and each request gets its own branches'
results back. The prefix is read once whatever the engine and whatever its prefix cache
holds. No answer moves: an engine answers a question the same whatever other questions
share its job (tests/test_order.py: 0 on llama.cpp, within 1e-6 on the others).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .engines import Engine, JobResult, ScoreJob
from .errors import ActivationOverflow, DeciderError
from .guard import LogitsGuard, guarded_score

# asked between chunks with a group's members: an error ends their job
MembersStop = Callable[[tuple[int, ...]], DeciderError | None]


@dataclass(slots=True)  # one for every job of every call: frozen costs twice as much
class PrefixGroup:
    job: ScoreJob  # the members' branches, in member order, after their shared prefix
    members: tuple[int, ...]  # their indexes in the call's requests
    spans: tuple[slice, ...]  # each member's branches in the job

    def split(self, result: JobResult) -> list[JobResult]:
        """The job's result as each member's own."""
        if len(self.members) == 1:
            return [result]
        return [JobResult(result[span], result.cached_tokens) for span in self.spans]


def group_by_prefix(jobs: Sequence[ScoreJob]) -> list[PrefixGroup]:
    """One group per distinct prefix, in the order each prefix first comes."""
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        by_prefix.setdefault(job.prefix, []).append(i)
    return [_group(jobs, members) for members in by_prefix.values()]


def _group(jobs: Sequence[ScoreJob], members: list[int]) -> PrefixGroup:
    if len(members) == 1:
        job = jobs[members[0]]
        return PrefixGroup(job, tuple(members), (slice(None),))
    branches, questions, spans = [], [], []
    for i in members:
        job = jobs[i]
        spans.append(slice(len(branches), len(branches) + len(job.branches)))
        branches += job.branches
        # a job without questions counts each branch as one (ScoreJob.units)
        questions += job.questions or (1,) * len(job.branches)
    merged = ScoreJob(jobs[members[0]].prefix, tuple(branches), tuple(questions))
    return PrefixGroup(merged, tuple(members), tuple(spans))


def score_groups(engine: Engine, guard: LogitsGuard, jobs: Sequence[ScoreJob],
                 groups: Sequence[PrefixGroup], stop: MembersStop | None = None
                 ) -> list[JobResult | Exception]:
    """Each job's result from one engine call of the groups' jobs, split back. A group
    whose activations overflowed is scored again job by job, so that only the one at
    fault is refused (as guarded_score does for jobs); any other error is every member's."""
    results: list[JobResult | Exception] = [None] * len(jobs)
    scored = guarded_score(engine, guard, [g.job for g in groups],
                           stop and (lambda g: stop(groups[g].members)))
    for group, result in zip(groups, scored, strict=True):
        if isinstance(result, ActivationOverflow) and len(group.members) > 1:
            alone = guarded_score(engine, guard, [jobs[i] for i in group.members],
                                  stop and (lambda k, m=group.members: stop((m[k],))))
        elif isinstance(result, Exception):
            alone = [result] * len(group.members)
        else:
            alone = group.split(result)
        for i, r in zip(group.members, alone, strict=True):
            results[i] = r
    return results
