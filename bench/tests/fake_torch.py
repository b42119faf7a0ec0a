"""A stand-in for the parts of torch that collectives/torch_allreduce.py calls, on numpy, for one
rank (world 1: every allReduce is the identity), so that its whole flow (buffers, capture, check,
timing, rows) runs in the tests without torch or a GPU. CUDA graphs record the fake collectives
called while capturing and run them again on replay. `one_shot` / `two_shot`: the fake
symmetric-memory ops (None: torch lacks it); `wrong`: the one-shot result off by one."""
import contextlib
import types


def install(np, modules, one_shot=True, two_shot=True, wrong=False):
    """Puts fake torch, torch.distributed and torch.distributed._symmetric_memory in `modules`
    (a dict like sys.modules)."""

    class T(np.ndarray):
        def numel(self):
            return self.size

        def to(self, dtype):
            return self.astype(np.float32).view(T)

        def float(self):
            return self.to(np.float32)

        def fill_(self, v):
            self.fill(v)
            return self

        def item(self):
            return self.reshape(-1)[0].item()

    def tensor_of(a):
        return np.asarray(a).view(T)

    capture = []  # the graph being captured: its list of thunks

    def collective(run):
        run()
        if capture:
            capture[-1].append(run)

    torch = types.ModuleType("torch")
    torch.__version__ = "fake"
    torch.bfloat16 = torch.float32 = np.float32
    torch.int32, torch.float64 = np.int32, np.float64
    torch.device = lambda *a: "fake-device"
    torch.empty = lambda n, dtype=None, device=None: tensor_of(np.zeros(n, np.float32))
    torch.tensor = lambda v, device=None, dtype=None: tensor_of(np.array(v, dtype=dtype or np.int64))
    torch.arange = lambda a, b, device=None: tensor_of(np.arange(a, b))

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 2.0  # ms per batch

    class Stream:
        def wait_stream(self, other):
            pass

    class CUDAGraph:
        def __init__(self):
            self.thunks = []

        def replay(self):
            for t in self.thunks:
                t()

    @contextlib.contextmanager
    def graph(g):
        capture.append(g.thunks)
        try:
            yield
        finally:
            capture.pop()

    torch.cuda = types.SimpleNamespace(
        Event=Event, Stream=Stream, CUDAGraph=CUDAGraph, graph=graph, synchronize=lambda: None,
        set_device=lambda d: None, current_device=lambda: 0, current_stream=Stream,
        stream=lambda s: contextlib.nullcontext(), nccl=types.SimpleNamespace(version=lambda: (2, 27, 0)))

    def fake_one_shot(inp, reduce_op, group_name):
        out = tensor_of(np.empty_like(inp))

        def run():
            out[:] = inp + (1 if wrong else 0)

        collective(run)
        return out

    def fake_two_shot(inp, reduce_op, group_name):
        collective(lambda: None)
        return inp

    ops = {}
    if one_shot:
        ops["one_shot_all_reduce"] = fake_one_shot
    if two_shot:
        ops["two_shot_all_reduce_"] = fake_two_shot
    torch.ops = types.SimpleNamespace(symm_mem=types.SimpleNamespace(**ops))

    dist = types.ModuleType("torch.distributed")
    dist.init_process_group = lambda *a, **k: None
    dist.destroy_process_group = lambda: None
    dist.group = types.SimpleNamespace(WORLD=types.SimpleNamespace(group_name="0"))
    dist.barrier = lambda: None
    dist.all_reduce = lambda t: collective(lambda: None)
    symm = types.ModuleType("torch.distributed._symmetric_memory")
    symm.empty = lambda n, device=None, dtype=None: tensor_of(np.zeros(n, np.float32))
    symm.rendezvous = lambda t, group_name: None
    torch.distributed, dist._symmetric_memory = dist, symm
    modules.update({"torch": torch, "torch.distributed": dist, "torch.distributed._symmetric_memory": symm})
