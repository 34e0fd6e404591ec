"""The other names a model holds a frozen module under (``observe/diagnose.py``): a target that
is the online network itself has them, a copy made by ``deepcopy`` has none."""

from __future__ import annotations

import copy
import weakref

from torch import nn

from hooktrace.observe.diagnose import other_names


class Learner(nn.Module):
    def __init__(self, share: bool) -> None:
        super().__init__()
        self.online = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.target = self.online if share else copy.deepcopy(self.online)


def test_a_shared_target_has_the_online_names() -> None:
    learner = Learner(share=True)
    assert other_names(weakref.ref(learner), ["target", "target.0", "target.1"]) == {
        "aliases": {"target": ["online"], "target.0": ["online.0"], "target.1": ["online.1"]}}


def test_a_copy_and_nothing_frozen_have_none() -> None:
    learner = Learner(share=False)
    assert other_names(weakref.ref(learner), ["target", "target.0"]) == {}
    assert other_names(weakref.ref(Learner(share=True)), []) == {}
    assert other_names(None, ["target"]) == {}
