"""The recorder's module marks: each module call of the program is a range named by its path (`blocks.3.attn`),
its backward a range on the autograd thread, its recomputation inside a backward a range of its own; and the
module metadata a reader needs (each path's type, the compiled modules, FLOPs per module: `module_flops`).

Paths. A module's path is its name in the outermost module's `named_modules()` (the module whose call is the
`forward` mark, `marks`), less the wrappers that stand for the module they hold: DDP's and DataParallel's
`module`, torch.compile's `_orig_mod`, FSDP's `_fsdp_wrapped_module` and the checkpoint wrapper's
`_checkpoint_wrapped_module`. A wrapper's range is its module's, typed by the class it holds. The outermost module
gets no range of its own (the `forward` and `backward` marks are its). A module held at several paths (shared) is
named by the path under the innermost module call open on its thread. Modules down to the depth asked for
(`--modules depth:N`, `blocks` being depth 1) get ranges. The paths come from a walk of the outermost module's
tree, walked again when a module not in it is called (at most once per outermost call): a module made during the
forward, outside the tree, gets no range.

Compiled modules. A module compiled with `torch.compile(module)` or `module.compile()` is one range, its call
(`marks` calls the hooks around an in-place compiled call, which the compiled code would hide); the modules
inside it get none, even where its code runs them eagerly (after a graph break).

Backward. The autograd graph is left as it is: module backward hooks (`register_full_backward_hook`) would put
a node around each module's inputs and outputs. Instead, when a module's forward returns, the nodes it created
are those whose sequence number (each thread numbers the nodes it creates) lies between the counter's values at
its call and at its return. A pre-hook on the nodes of its outputs opens its backward range when the first of
them runs; a hook on the earliest-made node reachable from them within the module closes it: the engine runs
the ready node of the highest number first, and no node of the module waits on that one, so it runs last.
Nodes of the program's other branches that the engine runs in between fall in the range. A range still open
when the outermost backward returns (a node that never ran) is closed then. Hooks on nodes change no gradient
and add no node.

Recomputation. A module call while a backward runs (activation checkpointing runs the forward again) is a
`module_recompute` range; its nodes are followed as a forward's, so a reentrant checkpoint's backward of the
recomputed graph gets its module backward ranges.

Each hook runs under the recorder's guard (`notes`): a failure ends the module marks with a note, and the
program runs on.
"""

from __future__ import annotations

import heapq
import json
import threading
import weakref

import torch
from torch import nn

from profiler_kit.names import (
    KIND_AUTO,
    MODULE_BACKWARD_CATEGORY,
    MODULE_CATEGORIES,
    MODULE_CATEGORY,
    MODULE_RECOMPUTE_CATEGORY,
    STEP,
)
from profiler_kit.nvtx_ranges import Mark, auto_name, module_end, module_start, modules_mark
from profiler_kit.recording.notes import Notes

WHAT = "the module marks (forward, backward and recomputation per module)"
# The child through which a wrapper stands for the module it holds: by its name, and `module` of these classes.
_HELD = frozenset(("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"))
_HOLDERS = frozenset(("DistributedDataParallel", "DataParallel"))
_sequence = torch.autograd._get_sequence_nr
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class Place:
    """Where a module sits: its path, its type (the class the program wrote, behind any wrapper), whether its
    calls get ranges, and the record_function name of each category of its ranges."""

    __slots__ = ("path", "type", "ranged", "names")

    def __init__(self, path: str, type_name: str, ranged: bool) -> None:
        self.path, self.type, self.ranged = path, type_name, ranged
        self.names = {category: auto_name(path, None, category) for category in MODULE_CATEGORIES} if ranged else {}


def held_child(module: nn.Module) -> str | None:
    """The name of the child through which `module`, a wrapper, stands for the module it holds; None when it is
    no wrapper."""
    children = module._modules
    if "module" in children and type(module).__name__ in _HOLDERS:
        return "module"
    return next((name for name in _HELD if name in children), None)


def type_name(module: nn.Module) -> str:
    """The class name of `module`, or of the module it holds through its wrappers."""
    while (name := held_child(module)) is not None:
        module = module._modules[name]
    return type(module).__name__


def is_compiled(module: nn.Module) -> bool:
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


class Tree:
    """The places of every module in one outermost module's tree (by the module's id: the tree holds no module
    alive), the types of the paths that get ranges (and of the outermost module, path ""), and the paths of the
    compiled modules."""

    def __init__(self, root: nn.Module, depth: int | None) -> None:
        self.places: dict[int, tuple[Place, ...]] = {}
        self.ranged: dict[int, Place] = {}  # the modules at one place, which gets ranges
        self.quiet: set[int] = set()  # the modules at one place, which gets none
        self.missed: set[int] = set()  # modules called but not in the tree when it was walked again
        self.types: dict[str, str] = {}
        self.compiled: list[str] = []
        # module, its path's parts, inside a compiled module, held by the wrapper whose path it shares
        todo: list[tuple[nn.Module, tuple[str, ...], bool, bool]] = [(root, (), False, False)]
        while todo:
            module, parts, inside, held = todo.pop()
            path = ".".join(parts)
            ranged = bool(parts) and not inside and not held and (depth is None or len(parts) <= depth)
            kind = type_name(module)
            self.places[id(module)] = (*self.places.get(id(module), ()), Place(path, kind, ranged))
            if ranged or not parts and not held:
                self.types[path] = kind
            compiled = not inside and not held and is_compiled(module)
            if compiled and ranged or compiled and not parts:
                self.compiled.append(path)
            holds = held_child(module)
            for name, child in reversed(module._modules.items()):
                if child is not None:
                    same = name == holds
                    todo.append((child, parts if same else (*parts, name), inside or compiled, same))
        for key, places in self.places.items():
            if len(places) == 1 and places[0].ranged:
                self.ranged[key] = places[0]
            elif len(places) == 1:
                self.quiet.add(key)


class _Call:
    """A module call open on its thread: `first` the number of the first node it may make (-1 without
    gradients), `lead` the node numbered `first` when a call inside it found it (its earliest, then). A call
    without a mark is a scout: a module without ranges that begins its caller, there only to find that node; it
    stands for its caller (its place, whether it recomputes)."""

    __slots__ = ("module", "place", "recompute", "first", "mark", "lead")

    def __init__(self, module: int, place: Place, recompute: bool, first: int, mark: Mark | None) -> None:
        self.module, self.place, self.recompute, self.first, self.mark = module, place, recompute, first, mark
        self.lead = None


class _Backward:
    """One module call's backward: opened by the first of its output nodes to run, closed by its earliest node."""

    __slots__ = ("owner", "place", "mark")

    def __init__(self, owner: ModuleMarks, place: Place) -> None:
        self.owner, self.place, self.mark = owner, place, None

    def open(self, _grad_outputs: tuple) -> None:
        if self.mark is not None or not self.owner.on or _is_compiling():
            return
        try:
            self.mark = module_start(self.place.path, MODULE_BACKWARD_CATEGORY,
                                     self.place.names[MODULE_BACKWARD_CATEGORY])
            self.owner.backward[id(self)] = self
        except Exception as exc:  # the program must run on whatever the recorder does
            self.owner.lost(exc)

    def close(self, _grad_inputs: tuple | None = None, _grad_outputs: tuple | None = None) -> None:
        if self.mark is None or _is_compiling():
            return
        mark, self.mark = self.mark, None
        self.owner.backward.pop(id(self), None)
        try:
            module_end(mark)
        except Exception as exc:
            self.owner.lost(exc)


def _output_nodes(output: object, first: int, last: int) -> dict[int, object]:
    """The autograd nodes of the tensors in `output` (in tuples, lists and dicts) numbered in [first, last), by
    number."""
    if isinstance(output, torch.Tensor):  # most modules return one tensor
        node = output.grad_fn
        return {number: node} if node is not None and first <= (number := node._sequence_nr()) < last else {}
    nodes, todo = {}, [output]
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            node = value.grad_fn
            if node is not None and first <= (number := node._sequence_nr()) < last:
                nodes[number] = node
        elif isinstance(value, (tuple, list)):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
    return nodes


def earliest_node(nodes: dict[int, object], first: int, last: int) -> object:
    """Of the nodes numbered in [first, last) that `nodes` reach (themselves included), the earliest made. The
    search follows the lowest number first (a node's inputs were made before it) and stops at `first`, the
    module call's first node, which is where it usually leads: it walks one path of the graph, not all of it."""
    heap = list(nodes.items())  # the numbers differ, so the nodes are never compared
    heapq.heapify(heap)
    seen = set(nodes)
    low, earliest = last, None
    while heap:
        number, node = heapq.heappop(heap)
        if number < low:
            low, earliest = number, node
            if number == first:
                break
        for child, _ in node.next_functions:
            if child is not None and first <= (n := child._sequence_nr()) < last and n not in seen:
                seen.add(n)
                heapq.heappush(heap, (n, child))
    return earliest


class ModuleMarks:
    """The module marks of one process down to `depth` (None: every depth); see the module docstring.
    `metadata` is the recording's module metadata (`names.MODULES_KEY`), kept up to date in place; with
    `announce` it is also an NVTX mark at the end of every step (the metadata of an nsys report)."""

    def __init__(self, notes: Notes, depth: int | None, announce: bool = False) -> None:
        self.notes = notes
        self.depth = depth
        self.announce = announce
        self.on = True
        self.trees: weakref.WeakKeyDictionary[nn.Module, Tree] = weakref.WeakKeyDictionary()
        self.tree: Tree | None = None  # the latest outermost module's
        self.root: weakref.ref | None = None
        self.walked = False  # the tree was walked again during this outermost call
        self.local = threading.local()
        self.backward: dict[int, _Backward] = {}  # the backward ranges open now
        self.metadata: dict = {"depth": depth, "types": {}, "compiled": []}
        self.text: str | None = None  # the metadata as JSON, when it has not changed since
        self.finishing: list = []  # what else ends with the window (the FLOP count)

    def lost(self, exc: BaseException) -> None:
        self.on = False
        self.notes.lost(WHAT, exc)

    def stack(self) -> list[_Call]:
        """The module calls open on this thread, innermost last."""
        try:
            return self.local.stack
        except AttributeError:
            self.local.stack = []
            return self.local.stack

    def observers(self) -> list:
        """The range-event observers: the metadata mark at each step's end, when it is announced."""
        return [self.notes.guard(WHAT, self._step_end)] if self.announce else []

    # The tree

    def outermost(self, root: nn.Module) -> None:
        """An outermost module call begins: its tree names the calls until the next one."""
        if not self.on:
            return
        try:
            tree = self.trees.get(root)
            if tree is None:
                tree = self._walk(root)
            self.tree, self.root, self.walked = tree, weakref.ref(root), False
        except Exception as exc:
            self.lost(exc)

    def forget(self) -> None:
        """The trees are walked again at the next outermost call (a module was compiled in place)."""
        self.trees.clear()

    def _walk(self, root: nn.Module) -> Tree:
        tree = self.trees[root] = Tree(root, self.depth)
        self.metadata["types"].update(tree.types)
        self.metadata["compiled"] = sorted({*self.metadata["compiled"], *tree.compiled})
        self.changed()
        return tree

    def _place(self, module: nn.Module) -> Place | None:
        tree = self.tree
        if tree is None:
            return None
        places = tree.places.get(id(module))
        if places is None:  # made since the walk, or outside the tree (made during the forward: at most a walk)
            root = self.root() if self.root is not None else None
            if self.walked or root is None or id(module) in tree.missed:
                return None
            self.walked = True
            missed = tree.missed
            tree = self.tree = self._walk(root)
            places = tree.places.get(id(module))
            if places is None:
                tree.missed = missed | {id(module)}
                return None
        if len(places) == 1:
            return places[0]
        stack = self.stack()
        under = stack[-1].place.path + "." if stack else ""
        return next((place for place in places if place.path.startswith(under)), places[0])

    # Forward and recomputation (called by the marks' global module hooks)

    def enter(self, module: nn.Module, recompute: bool) -> None:
        # Every module call of the program comes here: the common cases come first and cost little.
        tree = self.tree
        if tree is None or not self.on:
            return
        key = id(module)
        try:
            place = tree.ranged.get(key)
            if place is None:
                if key in tree.quiet:
                    self._scout(key)
                    return
                place = self._place(module)  # at several places, or not in the tree
                if place is None or not place.ranged:
                    return
            category = MODULE_RECOMPUTE_CATEGORY if recompute else MODULE_CATEGORY
            first = _sequence() if _grad_enabled() else -1
            self.stack().append(_Call(key, place, recompute, first,
                                      module_start(place.path, category, place.names[category])))
        except Exception as exc:
            self.lost(exc)

    def _scout(self, key: int) -> None:
        """A call without ranges that begins the call around it (no node made since that one began) finds the
        first node for it (see `_follow`)."""
        stack = self.stack()
        if stack and (caller := stack[-1]).lead is None and caller.first >= 0 and caller.first == _sequence():
            stack.append(_Call(key, caller.place, caller.recompute, caller.first, None))

    def leave(self, module: nn.Module, output: object) -> None:
        try:
            stack = self.local.stack
        except AttributeError:
            return
        if not stack or stack[-1].module != id(module) or not self.on:
            return
        call = stack.pop()
        try:
            if call.mark is not None:
                module_end(call.mark)
            if call.first >= 0 and _grad_enabled():
                self._follow(call, output, stack[-1] if stack else None)
        except Exception as exc:
            self.lost(exc)

    def _follow(self, call: _Call, output: object, caller: _Call | None) -> None:
        """Hook the nodes the call made (see the module docstring). A call whose first node a call inside it
        found needs no search; one that finds its own first node hands it to its caller when they begin
        together (a block and its first layer, ranged or a scout), so that nested calls search the graph about
        once and a block searches only its first layer's nodes."""
        last = _sequence()
        if last <= call.first:
            return
        nodes = _output_nodes(output, call.first, last)
        if not nodes:
            return
        earliest = call.lead or earliest_node(nodes, call.first, last)
        if caller is not None and caller.first == call.first and earliest._sequence_nr() == call.first:
            caller.lead = earliest
        if call.mark is None:  # a scout
            return
        backward = _Backward(self, call.place)
        for node in nodes.values():
            node.register_prehook(backward.open)
        earliest.register_hook(backward.close)

    def backward_done(self) -> None:
        """The outermost backward returned: the backward ranges still open end."""
        for backward in list(self.backward.values()):
            backward.close()

    def finish(self) -> None:
        """The window or the program ends: the backward ranges still open end, and the metadata is announced
        once more if it changed since the last step's end."""
        self.backward_done()
        for finish in self.finishing:
            finish()
        if self.announce and self.on and self.text is None:
            self._announce()

    # The metadata

    def changed(self) -> None:
        self.text = None

    def _step_end(self, opened: bool, name: str, kind: str, _token: int, _number: int | None) -> None:
        if not opened and kind == KIND_AUTO and name == STEP and self.on:
            self._announce()

    def _announce(self) -> None:
        if self.text is None:
            self.text = json.dumps(self.metadata, separators=(",", ":"))
        modules_mark(self.text)

