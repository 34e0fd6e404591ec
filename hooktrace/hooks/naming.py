"""Which model a module belongs to and its fqn, found once per module and cached weakly.

A module first called outside any other traced module belongs to its *owner*: the outermost
``nn.Module`` that is ``self`` in one of the calling frames and whose tree holds it (a VAE whose
``encode`` calls ``self.encoder``, a LightningModule whose ``training_step`` calls ``self.net``);
failing that, when the calling code has no variable for the module itself, the largest module its
variables hold whose tree holds it (``model.get_input_embeddings()(ids)``); else it is its own
owner. The owner is a top-level *model*: its whole tree is named at that moment
(``named_modules()`` names, wrapper prefixes such as DDP's ``module.`` removed) and written as
``model`` + ``module`` records. A model whose root a later model's tree holds (SSDlite's backbone,
called on its own at construction to size its feature maps) is adopted whole by it: its calls so
far stay its own model's in the log, its modules are named anew in the later one (models given
with ``model=`` stay as given). A module first
seen inside another's forward that the caller registers (``self.fc = nn.Linear(...)`` in its
``forward``) gets its real name, ``caller.fc``; one never registered is named under its caller
as ``caller.(ClassName)``, or after the place its caller keeps it in,
``caller.(blocks[0])`` for a module in a plain list (or tuple, or dict) attribute; two such modules
alive at once never share a name (``(Linear#2)``), while one built anew at each call keeps its
predecessor's. A child that a wrapper holds beside the model it wraps (``DataParallel(model).fc
= ...``) is named ``(DataParallel).fc``: the wrapper's forward never calls it. A module
registered under two parents (one block shared by an encoder and a decoder) is named by the path
of the parent that calls it: its calls from the decoder are ``decoder.block``, a name whose
``module`` record says ``alias_of`` its first name. A module that several models hold
(ultralytics' ``Conv.default_act``: one ``nn.SiLU`` in every Conv of every model) is named in
each, and a call is named by the model of its caller: a probe model run once does not take the
trained model's calls. ``id()`` is never used as identity: ids of freed modules are reused.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrize import ParametrizationList

from hooktrace.hooks.owners import (
    compiled_graph,
    holder_of,
    owner_of,
    place,
    registered,
    variable_name,
)
from hooktrace.log import schema

# wrapper class name -> attribute holding the wrapped module; the wrapper itself is not traced
WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
    "CheckpointWrapper": "_checkpoint_wrapped_module",
    "OffloadWrapper": "_checkpoint_wrapped_module",
}

@dataclass(slots=True, eq=False)  # identity hash: a key of per-step call counters
class ModInfo:
    model: int
    fqn: str
    cls: str
    traced: bool  # False: named (its children nest under it) but filtered out by include/exclude
    # the module it names; None once that module is gone, or named anew in a model found later
    ref: Callable[[], nn.Module | None]
    has_params: bool  # parameters registered directly on it
    # how many of its own parameters required a gradient when it was named, as its module
    # record says (a freeze inside the first forward is then a change the first step's end sees)
    trainable: int = 0
    #: a module registered under several parents: its other names, by (model, fqn) of the
    #: parent that holds it there, and by (model, None) its name in another model that holds it
    #: too; a call from that parent, or else from that model, is recorded under that name
    aliases: dict[tuple[int, str | None], ModInfo] = field(default_factory=dict)


def _no_module() -> None:
    """The ``ref`` of an identity given up: its module is named anew in another model."""
    return None


def _in_model(known: ModInfo, model: int) -> ModInfo | None:
    """The identity in ``model`` of ``known``'s module: ``known``, or the name it has there as
    a module that several models hold; None where it has none (yet)."""
    return known if known.model == model else known.aliases.get((model, None))


def _wrapped(module: nn.Module) -> nn.Module | None:
    attr = WRAPPERS.get(type(module).__name__)
    inner = module._modules.get(attr) if attr else None
    return inner


Walked = tuple[str, nn.Module | None, nn.Module, str | None]


def _walk(module: nn.Module, prefix: str, seen: set[int], beside: str | None = None
          ) -> Iterator[Walked]:
    """(fqn, None, module, None) in named_modules() order, (fqn, wrapper, inner, None) for a
    skipped wrapper, then the wrapper's other children under ``(WrapperClass)``, each with the
    wrapper's class as its fourth item (``beside``).

    A module reached a second time is yielded again (an alias) but its children are not walked.
    """
    inner = _wrapped(module)
    if inner is not None:
        yield prefix, module, inner, None
        yield from _walk(inner, prefix, seen)
        cls = type(module).__name__
        for child_name, child in module._modules.items():
            if child is not None and child is not inner:
                here = f"({cls}).{child_name}"
                yield from _walk(child, f"{prefix}.{here}" if prefix else here, seen, cls)
        return
    yield prefix, None, module, beside
    if id(module) in seen:  # ids are stable here: every module of the tree is alive
        return
    seen.add(id(module))
    for child_name, child in module._modules.items():
        if child is not None:
            yield from _walk(child, f"{prefix}.{child_name}" if prefix else child_name, seen)


def _own_params(module: nn.Module) -> tuple[int, int, int]:
    """Elements of its own parameters and of those that require a gradient (a tensor once),
    and how many of its parameter tensors require one (as registered)."""
    listed = [p for p in module._parameters.values() if p is not None]
    once = {id(p): p for p in listed}.values()
    return (sum(p.numel() for p in once), sum(p.numel() for p in once if p.requires_grad),
            sum(1 for p in listed if p.requires_grad))


def _loose(module: nn.Module) -> list[str] | None:
    """Its attributes that are meant to train but are not registered: leaf tensors with
    requires_grad=True that are not nn.Parameters (once per module, when it is named)."""
    found = sorted(k for k, v in vars(module).items() if isinstance(v, torch.Tensor)
                   and not isinstance(v, nn.Parameter) and v.requires_grad and v.is_leaf)
    return found or None


_SAME_NAME_ALIVE = 64  # distinct names for unregistered modules of one class alive at once


def _drop(module: nn.Module) -> dict[str, Any]:
    """A random-drop layer's probability and what one draw drops (``schema.Module.drop``):
    torch's ``Dropout*`` (``p``), torchvision's ``StochasticDepth`` (``p``, ``mode``) and the
    ``DropPath`` of timm and others (``drop_prob``, one draw a sample)."""
    cls = type(module).__name__
    path = "DropPath" in cls
    p = getattr(module, "drop_prob" if path else "p", None)
    if not isinstance(p, (float, int)) or isinstance(p, bool):
        return {}
    if cls == "StochasticDepth" and getattr(module, "mode", "row") == "batch":
        unit = schema.DropUnit.BATCH
    elif cls == "StochasticDepth" or path:
        unit = schema.DropUnit.SAMPLE
    elif isinstance(module, (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.FeatureAlphaDropout)):
        unit = schema.DropUnit.CHANNEL
    elif isinstance(module, nn.modules.dropout._DropoutNd):
        unit = schema.DropUnit.ELEMENT
    else:
        return {}
    return {"drop": float(p), "drop_unit": unit}


class Naming:
    """Names modules on first sight and emits their ``model``/``module`` records."""

    def __init__(
        self,
        emit: Callable[[schema.Model | schema.Module], None],
        matches: Callable[[str, str], bool],  # (fqn, class name): traced
        scope: Sequence[nn.Module] | None = None,
    ) -> None:
        self._emit = emit
        self._matches = matches
        self._scoped = scope is not None
        # None marks a module that is not traced at all (a wrapper, or outside the scope)
        self._infos: weakref.WeakKeyDictionary[nn.Module, ModInfo | None] = (
            weakref.WeakKeyDictionary()
        )
        self._model_names: list[str] = []
        # the module record last written under each name: a module put in another's place
        # (``model[1] = nn.Sigmoid()``) writes its own when it differs (its class)
        self._written: dict[tuple[int, str], schema.Module] = {}
        self._by_fqn: dict[tuple[int, str], ModInfo] = {}  # one identity per (model, fqn)
        # traced modules with parameters of their own that no recorded step has called yet (the
        # tracer drops them as they are called): a parent may use their parameters directly,
        # as MultiheadAttention does its out_proj's
        self.uncalled: dict[ModInfo, None] = {}
        for model in scope or ():
            self.add_model(model)

    def _new_model_index(self, module: nn.Module, name: str | None) -> int:
        base = name or type(module).__name__
        unique, n = base, 1
        while unique in self._model_names:
            unique, n = f"{base}#{n}", n + 1
        self._model_names.append(unique)
        index = len(self._model_names) - 1
        self._emit(schema.Model(model=index, name=unique, cls=type(module).__name__))
        return index

    @property
    def models(self) -> int:
        """The models named so far (their ``model`` records)."""
        return len(self._model_names)

    def model_name(self, model: int) -> str:
        """The name of model ``model`` (its index), as the log's model record has it."""
        return self._model_names[model]

    def add_model(self, module: nn.Module, name: str | None = None) -> ModInfo | None:
        """Register ``module`` as a new top-level model and name its whole tree."""
        model = self._new_model_index(module, name or variable_name(module))
        return self._name_tree(module, model, "")

    def _name_tree(self, root: nn.Module, model: int, prefix: str) -> ModInfo | None:
        records: dict[str, schema.Module] = {}
        adopted: set[int] = set()  # former top-level models found in this tree
        named_before: set[str] = set()  # modules named already, their records written
        shared: ModInfo | None = None  # the identity of a module another model holds too
        for fqn, wrapper, module, beside in _walk(root, prefix, set()):
            if wrapper is not None:
                self._infos[wrapper] = None
                continue
            known = self._infos.get(module)
            if known is not None and known.model != model and not self._scoped and (
                    known.fqn == "" or known.model in adopted):
                # a model of its own until now (called on its own first, as SSDlite's backbone
                # is at construction): from here on its whole tree is named as part of this one
                adopted.add(known.model)
                self.uncalled.pop(known, None)
                known.ref = _no_module  # observers holding the old identity let it go
            elif known is not None and fqn not in records and (
                    known.fqn != "" or known.model != model):
                here = _in_model(known, model)
                if here is not None or known.fqn == "":
                    # a second path inside this model (or a model given apart): one identity
                    first = records.get(here.fqn) if here is not None else None
                    if first is not None and here is not None:
                        first.aliases = [*(first.aliases or []), fqn]
                        parent = fqn.rpartition(".")[0]
                        if parent != here.fqn.rpartition(".")[0]:  # one parent: no telling
                            records.update(self._aliases(module, here, fqn))
                    continue
                # held by a model named earlier too (ultralytics' ``Conv.default_act``, one SiLU
                # in every Conv of every model): named here too, its calls from here so
                shared = known
            if known is not None:
                named_before.add(fqn)
            params, trainable, tensors = _own_params(module)
            info = self._by_fqn.get((model, fqn))
            if info is not None and info.cls == type(module).__name__:
                info.ref = weakref.ref(module)  # a module built anew in each forward: same name
                info.trainable = tensors
            else:
                cls = type(module).__name__
                info = ModInfo(model, fqn, cls, self._matches(fqn, cls),
                               weakref.ref(module), params > 0, tensors)
                self._by_fqn[(model, fqn)] = info
                if info.has_params and info.traced:
                    self.uncalled[info] = None
            if shared is None:
                self._infos[module] = info
            else:
                shared.aliases[(model, None)] = info
                shared = None
            records[fqn] = schema.Module(model, fqn, info.cls, params, trainable,
                                         loose=_loose(module), wrapper=beside,
                                         **_drop(module))
        for fqn, record in records.items():
            last = self._written.get((model, fqn))
            if last is None or (last != record and fqn not in named_before):
                self._written[(model, fqn)] = record
                self._emit(record)
        return self._infos.get(root)  # None for a wrapper: only what it wraps is traced

    def _aliases(self, module: nn.Module, known: ModInfo, fqn: str
                 ) -> dict[str, schema.Module]:
        """``fqn``, a second path to ``known``'s ``module``: it and each module inside it get a
        name under that path (``decoder.block``, ``decoder.block.0``), the one their calls from
        there are recorded under; their ``module`` records, by name."""
        records = {}
        for rel, inner in module.named_modules():
            named = self._infos.get(inner)
            first = known if not rel else named and _in_model(named, known.model)
            if first is None or named is None:
                continue
            name = f"{fqn}.{rel}" if rel else fqn
            records[name] = self._alias(first, name, name.rpartition(".")[0], named)
        return records

    def _alias(self, known: ModInfo, fqn: str, parent: str, named: ModInfo) -> schema.Module:
        """``fqn``, a second path to ``known``'s module under another ``parent``: the name of
        its calls from that parent (kept on ``named``, the identity its calls are looked up
        by), and its ``module`` record (no parameters: ``known`` holds them)."""
        alias = self._by_fqn.get((known.model, fqn))
        if alias is None or alias.cls != known.cls:
            # traced when either name is asked for: ``--include 'net*'`` still records the
            # backbone that a wrapper calls as ``online_encoder.net``
            alias = ModInfo(known.model, fqn, known.cls,
                            known.traced or self._matches(fqn, known.cls),
                            known.ref, False)
            self._by_fqn[(known.model, fqn)] = alias
        alias.ref = known.ref
        named.aliases.setdefault((known.model, parent), alias)
        return schema.Module(known.model, fqn, known.cls, alias_of=known.fqn)

    def _from_owner(self, module: nn.Module) -> ModInfo | None:
        """Name a module first called outside any traced module through its owner's tree; a
        parametrization evaluated while it is registered (``spectral_norm`` on a layer not yet
        in a model) is not named then: its model names it when it first calls it."""
        owner = owner_of(module)
        if isinstance(owner, ParametrizationList) and owner not in self._infos:
            return None
        if owner is module:
            name = variable_name(module)
            holder = holder_of(module) if name is None else None
            if holder is None:
                return self.add_model(module, name)
            owner = holder
        if owner not in self._infos:
            self.add_model(owner)
        else:  # the owner is known: the module joined its tree after it was named
            known = self._infos[owner]
            if known is None:  # a wrapper, or outside the scope: name the module on its own
                return self.add_model(module)
            self._name_tree(owner, known.model, known.fqn)
        return self._infos[module]

    def known(self, module: nn.Module) -> ModInfo | None:
        """The module's identity if it was named (called) while tracing; never names it."""
        return self._infos.get(module)

    def lookup(self, module: nn.Module, caller: ModInfo | None) -> ModInfo | None:
        """The module's identity, naming it first if new. ``caller``: the traced module whose
        forward is running, None at top level. None means: do not trace this module."""
        try:
            info = self._infos[module]
        except KeyError:
            pass
        else:
            if info is not None and info.aliases and caller is not None:
                # the name under its caller: its path there, else its name in the caller's model
                aliases = info.aliases
                return aliases.get((caller.model, caller.fqn)) or aliases.get(
                    (caller.model, None), info)
            return info
        if caller is None:
            if self._scoped or compiled_graph(module):
                self._infos[module] = None
                return None
            return self._from_owner(module)
        holder = caller.ref()
        key = registered(holder, module)
        if key is not None:  # made in the caller's forward, registered on it: its real name
            return self._name_tree(module, caller.model,
                                   f"{caller.fqn}.{key}" if caller.fqn else key)
        base = place(holder, module) or type(module).__name__
        return self._name_tree(module, caller.model, self._free(module, caller, base))

    def _free(self, module: nn.Module, caller: ModInfo, base: str) -> str:
        """``caller.(base)``, or ``caller.(base#2)``, ... where a module still alive holds it: two
        unregistered modules are never one name; one built anew at each call (its predecessor
        gone) keeps the name."""
        for n in range(1, _SAME_NAME_ALIVE + 1):
            name = f"({base})" if n == 1 else f"({base}#{n})"
            fqn = f"{caller.fqn}.{name}" if caller.fqn else name
            taken = self._by_fqn.get((caller.model, fqn))
            held = taken.ref() if taken is not None else None
            if held is None or held is module:
                return fqn
        # modules built in forward and kept alive (a leak): no name per module without bound
        return f"{caller.fqn}.({base})" if caller.fqn else f"({base})"

