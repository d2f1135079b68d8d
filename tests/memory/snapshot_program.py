"""A program's CUDA memory as the caching allocator logs it, written by hand: the snapshots the role and phase
tests read, with stacks as torch records them and `record_function` ranges as external annotations."""

from contextlib import contextmanager

ENGINE_FRAME = {"filename": "??", "line": 0, "name": "torch::autograd::Engine::thread_main(std::shared_ptr<>)"}
USER = {"filename": "/home/me/train.py", "line": 40, "name": "step"}
ZERO_GRAD = [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "line": 2900,
              "name": "zero_grad"}, USER]
OPTIM = [{"filename": "/venv/lib/python3.11/site-packages/torch/optim/adam.py", "line": 400, "name": "_init_group"},
         USER]
# Two parameters share a size, so a size stands for more than one parameter.
PARAM_SIZES = [4096 * 4, 1000 * 4, 1000 * 4, 64 * 4]
WORKSPACE = 32 * 1024**2
STATE_PER_PARAM = {"adam": 2, "sgd-momentum": 1, "sgd": 0}


def round_up(n: int, to: int = 512) -> int:
    return -(-n // to) * to


class Program:
    """The CUDA caching allocator's view of a program: one block per allocation, each event logged as torch logs
    it (while history is on), `record_function` ranges as external annotations, stacks as `stacks` records them
    ("all": C++ frames, the engine's among them; "python": Python frames only, none on the engine's thread)."""

    def __init__(self, stacks: str = "all") -> None:
        self.stacks = stacks
        self.time_us = 1_795_000_000_000_000
        self.next_address = 0x7F00_0000_0000
        self.live: dict[int, tuple[int, list, bool]] = {}
        self.trace: list[dict] = []
        self.annotations: list[dict] = []
        self.recording = False

    def _log(self, action: str, addr: int, size: int, frames: list) -> None:
        self.time_us += 5
        if self.recording:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": self.time_us, "frames": frames})

    def _frames(self, frames: list, engine: bool) -> list:
        if engine:
            return [ENGINE_FRAME] if self.stacks == "all" else []
        return frames

    def alloc(self, size: int, frames: list = (), engine: bool = False) -> int:
        addr = self.next_address
        self.next_address += round_up(size) + 512
        frames = self._frames(list(frames), engine)
        self.live[addr] = (size, frames, self.recording)
        self._log("alloc", addr, size, frames)
        return addr

    def free(self, addr: int, frames: list = (), engine: bool = False) -> None:
        size, _, _ = self.live.pop(addr)
        frames = self._frames(list(frames), engine)
        self._log("free_requested", addr, size, frames)
        self._log("free_completed", addr, size, frames)

    @contextmanager
    def range(self, name: str):
        self.time_us += 1
        self.annotations.append({"stage": "START", "name": name, "device": 0, "time_us": self.time_us})
        yield
        self.time_us += 1
        self.annotations.append({"stage": "END", "name": name, "device": 0, "time_us": self.time_us})

    def snapshot(self, requested_size: bool = True) -> dict:
        segments = []
        for addr, (size, frames, recorded) in sorted(self.live.items()):
            block = {"address": addr, "size": round_up(size), "state": "active_allocated",
                     "frames": frames if recorded else []}  # blocks older than the history carry no stack
            if requested_size:
                block["requested_size"] = size
            segments.append({"device": 0, "address": addr, "total_size": round_up(size), "stream": 0,
                             "segment_type": "large", "frames": [], "blocks": [block]})
        return {"segments": segments, "device_traces": [self.trace], "external_annotations": self.annotations}
