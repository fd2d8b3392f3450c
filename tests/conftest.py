import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from hf_models import save_hf_model  # noqa: E402


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """variant name -> (folder, transformers model); each saved once per session."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            folder = tmp_path_factory.mktemp(variant)
            cache[variant] = (folder, save_hf_model(variant, folder))
        return cache[variant]
    return get


CONTEXT, CHUNK = 96, 16
INT4_TABLES = ("--quantize-embeddings", "int4")


ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "runtime_cpp"


def shared_folder(tmp_path_factory) -> Path:
    """A temporary folder every process of this test run sees: under pytest-xdist (`make test` runs a worker
    per core) the workers' common parent, else the run's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make) -> Path:
    """`make(folder)` run once per test run, whichever worker asks first; the others wait for it and reuse
    its folder (which no test changes: tests that change an export copy it first)."""
    from filelock import FileLock

    folder = shared_folder(tmp_path_factory) / name
    with FileLock(f"{folder}.lock"):
        if not Path(f"{folder}.made").exists():
            make(folder)
            Path(f"{folder}.made").touch()
    return folder


def _build_runner(_folder) -> None:
    import executorch

    if not (BUILD / "CMakeCache.txt").is_file():
        subprocess.run(["cmake", "-S", str(ROOT / "runtime_cpp"), "-B", str(BUILD),
                        f"-DEXECUTORCH_ROOT={list(executorch.__path__)[0]}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(BUILD), "-j2"], check=True, capture_output=True)


@pytest.fixture(scope="session")
def runner(tmp_path_factory):
    """The runner, built (incrementally) as `make runner` builds it, once per test run."""
    made_once(tmp_path_factory, "runner", _build_runner)
    return BUILD / "hyflash-run"


def export_folder(target_dir, drafter, out, fmt, *flags):
    from hyflash.cli import main

    args = ["export", "--target", str(target_dir), "--drafter", str(drafter), "--out", str(out), "--format", fmt,
            "--max-context", str(CONTEXT), "--prefill-chunk", str(CHUNK), "--window", "24", *flags]
    assert main(args) == 0
    return out


def tokens_by_draft(runtime, prompt, max_new, drafts=("model", "none")):
    """draft mode -> the tokens `runtime` generates for `prompt` (EOS ignored): the exactness tests compare them."""
    from hyflash.runtime_py.loop import GenerationConfig

    return {draft: [t for new in runtime.generate(prompt, GenerationConfig(max_new_tokens=max_new, ignore_eos=True,
                                                                           draft=draft)) for t in new]
            for draft in drafts}


def word_tokenizer(vocab_size: int):
    """A real tokenizer.json for the tiny models: word i is "w{i}"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3")
    save_hf_model("qwen3", folder)
    word_tokenizer(96).save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="session")
def both_formats(qwen3_dir, tmp_path_factory):
    """The one export in the fast suite that lowers to .pte too (random mamba2 drafter), made once per test
    run (most test files read it). Its .pte is lowered the way a large target's is, in a spawned process that
    loads the models itself, so every ExecuTorch test runs on a program made by that path
    (`test_pte_lowered_in_its_own_process_is_the_same_program`, slow, checks it is byte for byte the
    in-process one; lowering twice would cost the fast suite 90 s)."""
    from hyflash.export import pipeline

    def make(out):
        limit, lower_apart, apart = pipeline.PTE_OWN_PROCESS_PARAMS, pipeline._pte_in_own_process, []

        def counted(*args):
            apart.append(args)
            return lower_apart(*args)

        pipeline.PTE_OWN_PROCESS_PARAMS, pipeline._pte_in_own_process = 0, counted
        try:
            export_folder(qwen3_dir, "random", out, "both")
        finally:
            pipeline.PTE_OWN_PROCESS_PARAMS, pipeline._pte_in_own_process = limit, lower_apart
        assert len(apart) == 1  # the .pte really came from the spawned process
    return made_once(tmp_path_factory, "both-formats", make)


def _reads_both_formats(item) -> bool:
    """The test asks for the shared export, by name or as a parameter it looks up."""
    params = item.callspec.params.values() if hasattr(item, "callspec") else ()
    return "both_formats" in item.fixturenames or "both_formats" in (p for p in params if isinstance(p, str))


def pytest_collection_modifyitems(items):
    """Under pytest-xdist a worker takes a file at a time, in this order: the first file that needs the shared
    export goes first, so one worker makes it while the other runs the files that do not need it."""
    needs = {item.path for item in items if _reads_both_formats(item)}
    first = next((item.path for item in items if item.path in needs), None)
    items.sort(key=lambda item: 0 if item.path == first else 2 if item.path in needs else 1)


@pytest.fixture(scope="session")
def rows_pte(qwen3_dir, tmp_path_factory):
    """The same pair as a program made exact with ExecuTorch's cache kernels (--pte-kernels executorch: a verify
    block attends row by row), as apps linking ExecuTorch's LLM kernels run it; the widest verify only."""
    return export_folder(qwen3_dir, "random", tmp_path_factory.mktemp("rows") / "pte", "pte",
                         "--pte-kernels", "executorch", "--verify-widths", "8")


@pytest.fixture(scope="session")
def int4_embeddings(qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 (tied embedding and LM head) with only its vocabulary tables quantized, ONNX only."""
    return export_folder(qwen3_dir, "random", tmp_path_factory.mktemp("qe") / "int4", "onnx", *INT4_TABLES)


@pytest.fixture(scope="session")
def int4_embeddings_pte(qwen3_dir, tmp_path_factory):
    """The same in both formats (slow tests: lowering to .pte)."""
    return export_folder(qwen3_dir, "random", tmp_path_factory.mktemp("qe") / "int4-both", "both", *INT4_TABLES)


@pytest.fixture(scope="session")
def fp16_onnx(qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 with a random drafter exported in fp16, ONNX only (the fast suite; made once per run)."""
    return made_once(tmp_path_factory, "fp16-onnx",
                     lambda out: export_folder(qwen3_dir, "random", out, "onnx", "--dtype", "fp16"))


@pytest.fixture(scope="session")
def fp16_both(qwen3_dir, tmp_path_factory):
    """The same in both formats (slow tests: lowering to .pte)."""
    return export_folder(qwen3_dir, "random", tmp_path_factory.mktemp("fp16") / "both", "both", "--dtype", "fp16")


@pytest.fixture(scope="session")
def reference_pte(tmp_path_factory):
    """The embedded pair exported to .pte (slow tests only: lowering its target takes minutes)."""
    from hyflash.export.pipeline import ExportConfig, export
    from hyflash.models.loading import resolve

    out = tmp_path_factory.mktemp("reference") / "pte"
    export(ExportConfig(target=resolve("reference", "target"), drafter=str(resolve("reference", "drafter")), out=out,
                        formats=("pte",)), progress=False)
    return out


@pytest.fixture(scope="session")
def reference_int4_pte(tmp_path_factory):
    """The embedded pair's .pte with the 8da4w target and int4 tables (slow tests only)."""
    from hyflash.export.pipeline import ExportConfig, export
    from hyflash.models.loading import resolve

    out = tmp_path_factory.mktemp("reference-int4") / "pte"
    export(ExportConfig(target=resolve("reference", "target"), drafter=str(resolve("reference", "drafter")), out=out,
                        formats=("pte",), quantize_target="int4", quantize_embeddings="int4"), progress=False)
    return out


def random_drafter_folder(target_dir, folder, seed: int = 5, scale: float = 0.1, **overrides):
    """A small drafter for the target in `target_dir`, every weight perturbed (scale x N(0, 1)) so that every
    path matters, saved to `folder`."""
    import torch

    from hyflash.models.drafter import Drafter, DrafterConfig
    from hyflash.models.loading import load_target, save_drafter, target_info

    target = load_target(target_dir)
    torch.manual_seed(seed)
    drafter = Drafter.for_target(target, DrafterConfig.for_target(
        target, ssm_heads=2, ssm_head_dim=16, d_state=16, markov_rank=8, **overrides))
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(scale * torch.randn_like(p))
    save_drafter(drafter, folder, target_info(target))
    return folder


@pytest.fixture(scope="session")
def lookup_input_drafter(qwen3_dir, tmp_path_factory):
    """A random mamba2 drafter folder that reads prompt-lookup's block (--lookup-input); its lookup gates
    start at zero (a drafter that ignores them), so the perturbation is larger, to make them matter."""
    return random_drafter_folder(qwen3_dir, tmp_path_factory.mktemp("lookup-input") / "drafter", seed=7, scale=0.3,
                                 lookup_input=True)


@pytest.fixture(scope="session")
def lookup_input_onnx(qwen3_dir, lookup_input_drafter):
    return export_folder(qwen3_dir, lookup_input_drafter, lookup_input_drafter.parent / "onnx", "onnx")


@pytest.fixture(scope="session")
def lookup_input_pte(qwen3_dir, lookup_input_drafter):
    """The same as .pte (slow tests: lowering)."""
    return export_folder(qwen3_dir, lookup_input_drafter, lookup_input_drafter.parent / "pte", "pte")
