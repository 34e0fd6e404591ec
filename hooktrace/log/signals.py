"""The ``signal`` record: what the training loop did around the modules; its kinds, spelled once
(``SignalKind``) and each documented (``Signal``).

Part of the log contract (``schema`` re-exports it): standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from hooktrace.log.fields import LogFact


class SignalKind:
    """Each kind of ``signal`` record, spelled once: the word on the wire, which every writer
    and reader names through these constants (``Signal``'s docstring says what each means).
    Plain strings, not an Enum: the log stays as it is, and a reader keeps a kind it does not
    know (a newer log's) as the word it read."""

    EVAL_BACKWARD: Final[str] = "eval-backward"
    OPTIMIZERS: Final[str] = "optimizers"
    SHARED_STORAGE: Final[str] = "shared-storage"
    GRADS_CARRIED_OVER: Final[str] = "grads-carried-over"
    BACKWARD_HOOK: Final[str] = "backward-hook"
    FROZEN_BN_TRAINING: Final[str] = "frozen-bn-training"
    GRADS_CLEARED: Final[str] = "grads-cleared"
    PARAMS_WITHOUT_GRAD: Final[str] = "params-without-grad"
    GRADS_ZEROED: Final[str] = "grads-zeroed"
    PARAMS_RECREATED: Final[str] = "params-recreated"
    TRAINABLE_CHANGED: Final[str] = "trainable-changed"
    LOSS_SCALE: Final[str] = "loss-scale"
    NONFINITE_WEIGHTS: Final[str] = "nonfinite-weights"
    HALF_UPDATES: Final[str] = "half-updates"
    GRAD_ZEROS: Final[str] = "grad-zeros"
    LOSS_OPS: Final[str] = "loss-ops"
    LOSS_SCALED: Final[str] = "loss-scaled"
    SCALED_STEP: Final[str] = "scaled-step"
    SCALED_CLIP: Final[str] = "scaled-clip"
    COMPILED_EAGER: Final[str] = "compiled-eager"
    OPTIMIZER_STEPS: Final[str] = "optimizer-steps"
    HOOKS_GROWING: Final[str] = "hooks-growing"
    FUNCTION_BACKWARD: Final[str] = "function-backward"
    STEP_SAMPLE: Final[str] = "step-sample"
    PROBE: Final[str] = "probe"
    LOSS_TERM_CUT: Final[str] = "loss-term-cut"
    LOSS_SHARE: Final[str] = "loss-share"
    LOSS_TARGET_GRAD: Final[str] = "loss-target-grad"
    TWINS: Final[str] = "twins"
    NONFINITE_INPUTS: Final[str] = "nonfinite-inputs"
    LOSS_VALUES: Final[str] = "loss-values"
    PARAMS_UNMOVED: Final[str] = "params-unmoved"
    OPTIMIZER_LRS: Final[str] = "optimizer-lrs"
    CALL_TIMES: Final[str] = "call-times"


def kinds_of(namespace: type) -> tuple[str, ...]:
    """The words a namespace of kinds (``SignalKind``) defines, in the order it defines them."""
    return tuple(v for k, v in vars(namespace).items() if k.isupper() and isinstance(v, str))


@dataclass(slots=True)
class Signal(LogFact):
    """What the training loop did around a model, written when it is first seen or changes
    (recorded and watched steps alike), at the step it happened in:

    * ``eval-backward``: a backward pass reached the model while ``model.training`` was False
      (once, until it is seen training again);
    * ``optimizers``: when an optimizer steps with parameters not seen before, at the end of a
      recorded pass after modules with parameters were first called since, and when tracing
      stops, where it changed (the last of a model holds): ``detail.held``, the model's
      modules whose trainable parameters an optimizer that stepped holds (fqns), and
      ``detail.not_held``, the modules with trainable parameters none holds;
      ``detail.frozen_held``, where there are any, the modules whose parameters are all frozen
      though such an optimizer holds them (built before a freeze); where the
      optimizers of the model held, at their first step, trainable parameters of no named
      module that had no gradient (one a parametrization replaced after the optimizer was
      built), ``detail.outside``, the shapes of the first 8, and ``detail.outside_count``;
    * ``shared-storage``: at an optimizer's first step, Parameters it holds that share one
      storage (``data_ptr``, device, dtype, shape, stride): ``detail.params`` in its order
      (``lm_head.weight``), ``detail.optimizer`` its class; ``fqn``, the last one's module;
    * ``grads-carried-over``: parameters whose ``.grad`` was neither zeroed nor set to None
      after an optimizer step, so the next backward adds to it (``detail.modules``: fqns);
    * ``backward-hook``: ``fqn`` has a deprecated ``register_backward_hook`` hook
      (``detail.hook``: its function's qualified name);
    * ``frozen-bn-training``: ``fqn`` is a BatchNorm without trainable parameters whose
      running statistics update (train mode) while its model trains;
    * ``grads-cleared``: an optimizer stepped with every ``.grad`` None although a backward
      pass reached its parameters' modules since its last step: ``zero_grad()`` ran between
      ``backward()`` and ``step()`` (``detail.modules``: fqns of the modules reached);
    * ``params-without-grad``: after a recorded backward pass, ``fqn`` has trainable own
      parameters that got no ``.grad`` while others of its own got one (a weight read through
      ``.data`` in its forward): ``detail.params``, their names, ``detail.with_grad``, the
      others'; written again when that changes (``params`` empty: all of them got one since);
    * ``grads-zeroed``: after a recorded backward pass, an optimizer stepped with every
      ``.grad`` it holds exactly zero (not None) although a backward pass reached their modules
      since its last step (``detail.modules``: fqns); once a run;
    * ``params-recreated``: ``fqn``'s own trainable parameters ``detail.params`` were new
      objects at the end of two recorded steps in a row (an ``nn.Parameter`` created in its
      forward), ``step`` the first of them; once per module;
    * ``trainable-changed``: at the end of recorded backward pass ``step``, modules of the
      model with fewer trainable own parameters than at the last recorded pass's end
      (``detail.frozen``: fqns; ``requires_grad_(False)`` in between) or more
      (``detail.unfrozen``); once per model and step with a change. The first recorded pass
      compares with the counts of the module records (a freeze inside the first forward).
      ``detail.aliases``, where a frozen module is held under other names too (a target
      network that is the online network itself): per such fqn, its other fqns;
    * ``loss-scale``: the scale ``detail.scale`` of the loss scaler (``torch.amp.GradScaler``)
      held by the code that ran the recorded backward pass ``step``, which the gradients of
      the pass still carry (they are unscaled in ``scaler.step``); when it changes;
    * ``grad-zeros``: after recorded backward pass ``step``, for the calls of modules with
      children whose output gradients are partly exactly zero: ``detail.share``, by the call's
      forward ``seq`` (a string), the share of exactly-zero elements in those of their output
      gradients that are not all zero (a loss reading part of the output; ``gradzeros.py``);
    * ``nonfinite-weights``: the first call of recorded step ``step`` with NaN/Inf in its
      outputs, ``fqn``, ran with NaN/Inf in its own parameters ``detail.params`` (names;
      ``detail.dtypes``: theirs): an optimizer step before made them so. Written after that
      call's event;
    * ``loss-ops``: the autograd ops of a recorded pass from a loss function (``detail.loss``:
      its node's name without ``Backward0``: ``NllLoss``, ``BinaryCrossEntropyWithLogits``,
      ``MseLoss``) back to the output of ``fqn`` (the outermost call that returned it):
      ``detail.ops``, the ops between, the loss's input first, and ``detail.out``, the op that
      made that output (below views and casts, ``VIEW_OPS``); ``detail.last``, the innermost
      module that returned it where it is another; when it changes;
    * ``loss-scaled``: the root of a recorded pass that reached the model was multiplied by
      the scale of the ``GradScaler`` the code holds ``detail.times`` times along one path
      (1: ``scaler.scale(loss)``); when it changes;
    * ``scaled-step``: an optimizer (``detail.optimizer``: its class) stepped gradients that
      a scaled pass (of step ``step``) left unchanged while the scaler had unscaled no
      optimizer since its last update (``optimizer.step()`` without ``scaler.step``):
      ``detail.modules``, fqns; once per optimizer;
    * ``scaled-clip``: ``clip_grad_norm_`` (``detail.max_norm``) clipped gradients that a
      scaled pass of step ``step`` left unchanged before any optimizer was unscaled
      (``detail.modules``, fqns); once a run;
    * ``compiled-eager``: the model call ``fqn`` of recorded step ``step`` ran inside
      ``torch.compile``'d code, run eagerly while the step was recorded (``Header.eager``);
      the steps not recorded ran it compiled; once a run;
    * ``optimizer-steps``: when tracing stops, per optimizer that stepped (``detail.optimizer``:
      its class) and model whose modules it holds (``detail.held``: their fqns, as at its first
      step): ``detail.count``, its steps; ``detail.after``, the backward pass (step) each came
      after (-1: before any), and ``detail.lr``, the largest learning rate of its groups at each
      (null: not a number read on the host), both for its first 64 steps; ``detail.moving``,
      the pass after which it first stepped with lr > 0 (null: never); ``step``, its first
      step's pass. Where there are any (``optsteps.py``): ``detail.again``, the steps where it
      applied the very gradients its last step applied, no backward pass between (``steps``,
      the first 20, ``count``, ``most`` in a row, ``of`` its steps looked at: without a
      closure, one per pass); ``detail.zero_lr``, per param group with gradients that stepped
      at lr 0 while another group of it stepped above 0 (``group``, ``steps``, ``count``,
      ``others``: the other groups' largest lr, ``moved``: it stepped above 0 itself at some
      step, ``modules``); ``detail.took_over``, where it took over the parameters another
      optimizer held (``step``, that one's ``steps`` and whether it kept ``state``);
      ``detail.resumed``, true where it stepped again after another took them over;
    * ``hooks-growing``: ``fqn``'s hooks of one kind (``detail.hooks``: ``forward``, its
      forward and forward pre hooks; ``backward``, its module backward hooks; ``gradient``, the
      gradient hooks of its own parameters) grew at each of the last recorded steps
      ``detail.steps`` (``step``, the first), to ``detail.counts`` (``hookcount.py``): a hook
      registered in the loop and never removed; once per module and kind;
    * ``function-backward``: the first call of the user's custom ``autograd.Function``
      ``detail.function`` (its backward at ``detail.file``:``detail.line``) in a recorded step,
      inside ``fqn``'s call, got a numerical gradient check (``functions.py``) its backward did
      not pass; what it measured (check decides what it means): ``detail.twice``, what the
      backward gave for twice the ``grad_output`` (``double``; the ``same``; ``other``); where
      it doubles, ``detail.elements`` compared with a finite difference, ``detail.off`` of them
      different, the worst one's ``detail.numeric`` and ``detail.backward``, ``detail.ratio``
      where the backward is the finite difference times one factor, ``detail.identity`` (the
      forward returned its input unchanged) and ``detail.flat`` (the forward is flat where they
      differ); once per class;
    * ``nonfinite-inputs``: the first call of recorded step ``step`` whose outputs held
      NaN/Inf, ``fqn``, got them in its inputs too: ``detail.inputs``, [input index, nan, inf]
      each (args then kwargs; an input the call changed in place is not judged); the NaN/Inf was
      made before it, not by it. Found where the outputs are checked at once (on the host);
    * ``params-unmoved``: when tracing stops, the parameter ledger's trainable parameters of a
      model that never moved (their bits the same at every look: each recorded step's end and
      the watched steps numbered by a power of two from 16) through two looks or more:
      ``detail.params``, each ``param`` (its fqn in the model), ``since`` and ``through`` (the
      steps of its first and last look), ``steps`` (optimizer steps since, counted to 16 at
      most), ``held`` (of those, the steps of an optimizer that holds it) and ``grads`` (of
      those, the ones it had a ``.grad`` at), the first 20 by name; ``detail.count`` in all;
      ``detail.modules``, the fqns of all of their modules, ``detail.dtypes`` their dtypes;
      ``detail.moved``, how many of the model's parameters were seen moving;
      ``detail.looks``, [step, passes an optimizer stepped after so far] at each look (64 at
      most) at which some of them had not moved; ``detail.cleared``, whether its gradients were
      replaced or not added to between two looks; on the CPU only (``ledger.py``);
    * ``half-updates``: when tracing stops, the model's float16 or bfloat16 trainable weights
      (``detail.dtype``; not an embedding's) sampled at a look and compared at the next look
      after an optimizer step: ``detail.compared``, [the sample's step, the step compared,
      sampled elements with a non-zero gradient that changed, those elements] each, 8 at most;
    * ``optimizer-lrs``: when tracing stops, per optimizer that stepped (``detail.optimizer``:
      its class; ``detail.models``, the models of its parameters, ``model`` the first):
      ``detail.count`` steps, ``detail.after``, the backward pass (step) each came after (-1:
      before any), and ``detail.lr``, the largest learning rate of its groups at each (null: not
      a number), side by side, a sample of one step in ``detail.every`` (past 256 the sample
      thins evenly over the run) with the last step kept; ``detail.decay``, where its step
      multiplies each weight by ``1 - lr * weight_decay`` (SGD, AdamW, a decoupled decay), the
      group and step of the largest such product (``step``: the pass, ``lr``, ``weight_decay``);
    * ``loss-values``: when tracing stops, the loss ledger's values of one group of models
      (``detail.models``, those the passes reached; ``model``, the first): the value each
      ``backward()`` started from (a one-element root), in recorded and watched steps,
      ``detail.steps`` and ``detail.values`` side by side, a sample of one pass in
      ``detail.every`` (past 256 values the sample thins evenly over the run) with the last
      pass always kept, ``detail.passes`` counted in all;
    * ``twins``: at the end of recorded step ``step``, models of one structure (their
      parameters' shapes and dtypes; ``model``: the first of them with a model record), by name
      in ``detail.models`` (a model's name, or the variable of a module never called that has
      one's structure): ``detail.same``, the groups of them whose weights are bit-identical;
      ``detail.changed`` and ``detail.unchanged``, those whose weights changed, or not, since the
      last look (one missing from both had none); ``detail.trained``, those an optimizer stepped
      so far; ``detail.replaced`` (where any), those whose weights changed after their
      optimizer's step, before this pass's end, into another's (``twins.py``);
    * ``step-sample``: when tracing stops, per model of the sampled parameters (up to 4, their
      modules ``detail.modules``; ``stepcheck.py``), facts of the optimizer steps about them,
      where there are any: ``detail.cleared``, per number of passes whose ``.grad`` was dropped
      (a new tensor, weights unchanged) between backward passes with no optimizer step
      between, before a step that applied the last pass's: ``[passes, accumulations so, the
      first one's first pass]``; ``detail.flips``, the recorded steps whose sampled gradients
      were all multiplied by one negative factor between the end of backward and the step
      (``steps``, the first 20, ``count``, ``factor``, the first's); ``detail.moves``
      (``stepmove.py``), per optimizer class whose update is modelled (``optimizer``, its
      ``modules`` of the model), the recorded steps judged (``judged``; ``steps``, the first 64,
      each ``[step, cosine, ratio, lr, moved, ascent]``: the cosine of the sampled weights' move
      with the update the kind makes of their gradient, lr and state, the ratio of their norms,
      the group's lr, whether they moved at all; ``ascent``: ``lr`` below 0, ``maximize``, or
      ``custom``, a user's class whose move is set against -g);
    * ``probe``: (``--probe``) what the probe measured of a model (``seeing.py``), at its first
      call in a recorded step with gradients on, one signal per fact; ``detail.what`` is
      ``batch`` (``verdict``: ``apart``, each sample's output depends on its own sample only,
      along input ``axis`` of ``samples``; ``some`` or ``all``, output ``sample`` depends on
      ``count`` others, the first ``sees``; ``mixers``, the BatchNorm layers in train mode;
      ``fqn``, the first of them), ``causal`` (``fqn``, an attention module with a mask
      that orders positions, ``masks`` (argument -> ``torch.triu(ones, k)``), ``is_causal``,
      or in a model fed ``x[:, :-1]`` (``next_step``); ``verdict`` ``holds`` or ``leaks``:
      its output at ``position`` depends on ``count`` later positions of its input, the first
      ``sees``), ``padding`` (``source``: ``padding_idx N`` or a ``key_padding_mask``;
      ``padded`` of ``positions``; ``verdict`` ``leaks`` where the output at real positions
      depends on ``seen`` padded ones; ``masks``: each attention module's padding mask,
      ``reads`` ``same``, ``inverted`` or ``other``; ``fqn``, the first that does not read
      the same) or ``undecided`` (``why``);
    * ``loss-term-cut``: a term added into the loss of recorded backward pass ``step`` (on the
      root's arithmetic top: sums, scales, means) carries no gradient: ``detail.reason`` is
      ``detach`` (``.detach()``, ``.data``), ``no_grad`` (an op under ``torch.no_grad()`` on a
      tensor or weight that needed a gradient), ``numpy`` (it went to numpy and came back),
      ``item`` (a Python number added back) or ``op`` (an op with no derivative);
      ``detail.op`` the op that cut it, ``detail.file``/``detail.line``/``detail.code`` where
      (the user's innermost frame), ``detail.calls`` the traced calls (``[model, fqn]``) whose
      outputs the cut tensor came from, ``detail.added_file``/``detail.added_line`` where it was
      added, ``detail.models`` the models the loss reached (``model``: the first); once per
      cut's line (``loss.py``);
    * ``loss-share``: a loss of recorded step ``step`` read ``detail.read`` of its
      ``detail.of`` targets or elements, each recorded step where it read less; ``detail.by``
      says what kept them: ``ignore_index``, an ``F.cross_entropy``/``F.nll_loss`` (or a module
      calling it) whose other targets equal ``detail.ignore_index``, at
      ``detail.file``:``detail.line`` (``detail.inside``: seen in the loss's graph only, computed
      inside a model's call); ``mask``, a 0/1 mask over the loss's elements (``detail.node``:
      ``Mul``, ``Index``, ``MaskedSelect``, ``Where``); ``index``, an integer tensor of 0s and
      1s as long as dim ``detail.dim`` (``detail.rows``) used as an index.
    * ``loss-target-grad``: the target of a regression loss (``detail.loss``: ``F.mse_loss``,
      ``F.l1_loss``, ``F.smooth_l1_loss``, ``F.huber_loss``) at ``detail.file``:``detail.line``
      carries a gradient into another call of model ``model``, whose output its prediction
      comes from too, through a max over that output (``detail.through``: ``Max``, ``Amax``,
      ``Logsumexp``): a bootstrapped target computed with gradient; once per line.
    * ``call-times``: at the end of recorded step ``step`` (or when tracing stops in it), how
      long the model's calls took, on the host's monotonic clock in microseconds
      (``timing.py``): side by side per call, its forward event's ``detail.seq``, its forward's
      ``detail.start`` (from ``detail.origin``, the clock at the step's first call),
      ``detail.forward`` and ``detail.own`` (without its children's), its backward's
      ``detail.backward_start`` and ``detail.backward`` (null: none in this step);
      ``detail.end``, the pass's end. Read through ``log/timing.py``.

    ``fqn`` is the module a signal is about (``""``: the model's root); on the wire ``"name"``.
    """

    TYPE: ClassVar[str] = "signal"
    KINDS: ClassVar[tuple[str, ...]] = kinds_of(SignalKind)
    step: int
    model: int
    fqn: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


#: autograd ops (node names without ``Backward<n>``) that only view, reshape, copy or cast a
#: tensor: in a ``loss-ops`` signal, what lies between ops that compute
VIEW_OPS = frozenset({"View", "UnsafeView", "Reshape", "ReshapeAlias", "Alias", "Expand",
                      "Squeeze", "Unsqueeze", "Transpose", "Permute", "T", "ToCopy", "Clone",
                      "Contiguous"})
