"""Modules run only under ``no_grad`` while the rest of their model trained: one warning per
model and run of steps, listing them by subtree; one module alone is named as itself."""

from __future__ import annotations

from .logbuild import header


def test_one_module_under_no_grad_is_named() -> None:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.reached import ran_under_no_grad

    c = Collected(header())
    m = ModuleStats(0, "fc2", "Linear", 18, 18)
    c.modules[(0, "fc2")] = m
    [f] = ran_under_no_grad(c, [(m, [0, 1, 2])])
    assert (f.cause, f.severity, f.module, f.step) == ("no-grad-under-no_grad", "warning", "fc2", 0)
    assert f.message.startswith("fc2 (Linear) ran under torch.no_grad while the rest of its "
                                "model trained: its 18 trainable parameters get no gradient")
    assert f.evidence == {"steps": [0, 1, 2]}


def test_several_modules_are_one_warning_by_subtree() -> None:
    from hooktrace.check.collected import Collected, ModuleStats
    from hooktrace.check.reached import ran_under_no_grad

    c = Collected(header())
    mods = [ModuleStats(0, name, "Linear", 10, 10, calls=1)
            for name in ("backbone.0", "backbone.1", "backbone.2")]
    c.modules.update({(0, m.fqn): m for m in mods})
    c.modules[(0, "backbone")] = ModuleStats(0, "backbone", "Sequential", 0, 0)
    c.modules[(0, "head")] = ModuleStats(0, "head", "Linear", 10, 10, calls=1)
    [f] = ran_under_no_grad(c, [(m, [1, 2]) for m in mods])
    assert (f.cause, f.severity, f.step) == ("no-grad-under-no_grad", "warning", 1)
    assert f.evidence["modules"] == ["backbone.0", "backbone.1", "backbone.2"]
    assert f.evidence["trainable"] == 30
    assert f.message.startswith("backbone (3 modules with 30 trainable parameters) ran only "
                                "under torch.no_grad")
