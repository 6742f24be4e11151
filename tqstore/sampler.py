"""TransferQueue's ``transfer_queue.sampler`` package under tqstore's name, so that imports written for
TransferQueue (``from transfer_queue.sampler import BaseSampler``) need only the package name
changed.  The samplers are :mod:`tqstore.samplers`' and :mod:`tqstore.seqlen_sampler`'s; see
docs/MIGRATING.md ("Samplers").
"""
from __future__ import annotations

from .samplers import BaseSampler, GRPOGroupNSampler, RankAwareSampler, SequentialSampler
from .seqlen_sampler import SeqlenBalancedSampler

__all__ = ["BaseSampler", "SequentialSampler", "GRPOGroupNSampler", "RankAwareSampler", "SeqlenBalancedSampler"]
