"""Save and load models in the official format of the paper's checkpoints (Qwen3 names and config).

    model = minigate.from_pretrained("data/checkpoints/headwise")                 # a local folder
    model = minigate.from_pretrained("QwQZh/gated_attention", subfolder="1B_gate_headwise",
                                     dtype=torch.float16, device="cuda")           # the Hub
    minigate.save_pretrained(model, "runs/my_model", tokenizer="data/tokenizer.json")

No remote code and no transformers model class: we read config.json and the weights ourselves
(model.safetensors, sharded safetensors, or pytorch_model.bin with weights_only=True).

In transformers: a baseline folder (gate "none") loads in AutoModelForCausalLM as Qwen3 with the same logits,
and its tokenizer (tokenizer.json + tokenizer_config.json, `save_tokenizer`) in AutoTokenizer with the same ids.
A gated folder declares model_type "minigate", which transformers refuses (it has no class for the gate);
an elementwise G1 model exports to Qwen3NextForCausalLM with minigate.export_qwen3_next (minigate/export.py).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from .config import ModelConfig
from .model import Transformer
from .runfolder import atomic_write

# (minigate name, official name), following transformers' Qwen3 naming; {L} = layer, {E} = expert, {p} = projection
_RENAMES = [
    ("embed.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("blocks.{L}.attn_norm.weight", "model.layers.{L}.input_layernorm.weight"),
    ("blocks.{L}.mlp_norm.weight", "model.layers.{L}.post_attention_layernorm.weight"),
    ("blocks.{L}.attn_out_norm.weight", "model.layers.{L}.attn_output_layernorm.weight"),  # minigate only
    ("blocks.{L}.mlp_out_norm.weight", "model.layers.{L}.mlp_output_layernorm.weight"),  # minigate only
    ("blocks.{L}.attn.{p}.weight", "model.layers.{L}.self_attn.{p}.weight"),
    ("blocks.{L}.attn.gate_bias", "model.layers.{L}.self_attn.gate_bias"),  # minigate only (ModelConfig.gate_bias)
    ("blocks.{L}.mlp.router.weight", "model.layers.{L}.mlp.gate.weight"),  # MoE: transformers calls the router gate
    ("blocks.{L}.mlp.experts.{E}.{p}.weight", "model.layers.{L}.mlp.experts.{E}.{p}.weight"),  # MoE experts
    ("blocks.{L}.mlp.{p}.weight", "model.layers.{L}.mlp.{p}.weight"),
]


def _rename(name: str, to_official: bool) -> str:
    for ours, theirs in _RENAMES:
        src, dst = (ours, theirs) if to_official else (theirs, ours)
        regex = re.escape(src).replace(r"\{L\}", r"(?P<L>\d+)").replace(r"\{E\}", r"(?P<E>\d+)")
        regex = regex.replace(r"\{p\}", r"(?P<p>\w+)")
        if m := re.fullmatch(regex, name):
            return dst.format(**m.groupdict())
    raise KeyError(name)


def to_official_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    return {_rename(k, True): v for k, v in model.state_dict().items()}


def save_pretrained(model: Transformer, path: str | os.PathLike, dtype: torch.dtype | str | None = None,
                    tokenizer: str | os.PathLike | None = None) -> Path:
    """Write config.json (official keys) and model.safetensors (official names) into `path`; `dtype` (e.g.
    torch.bfloat16) stores the weights in it, half the size: from_pretrained gives back exactly those values.
    `tokenizer` (a tokenizer.json, e.g. data/tokenizer.json) is saved beside them with `save_tokenizer`."""
    return write_folder(path, to_official_state_dict(model), model.cfg.to_hf_config(), dtype, tokenizer)


def write_folder(path: str | os.PathLike, state_dict: dict[str, torch.Tensor], config: dict,
                 dtype: torch.dtype | str | None = None, tokenizer: str | os.PathLike | None = None) -> Path:
    """A Hugging Face model folder, each file written atomically: model.safetensors (the tensors, in `dtype` if
    given), config.json, and the tokenizer beside them if given. save_pretrained and export_qwen3_next write this."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = _as_dtype(dtype) if dtype is not None else None
    tensors = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in state_dict.items()}
    atomic_write(path / "model.safetensors", lambda f: f.write(save(tensors, metadata={"format": "pt"})))
    atomic_write(path / "config.json", lambda f: f.write(json.dumps(config, indent=2).encode()))
    if tokenizer is not None:
        save_tokenizer(tokenizer, path)
    return path


def tokenizer_config(tokenizer_path: str | os.PathLike) -> dict:
    """The tokenizer_config.json that makes transformers.AutoTokenizer read a minigate tokenizer.json as it is:
    the same ids as minigate (without it AutoTokenizer guesses Qwen2Tokenizer and splits "\\n  def" otherwise),
    <bos> as bos_token, and decoding that leaves spaces alone. Like minigate's encode, it adds no <bos>:
    prepend tokenizer.bos_token_id yourself, as training did (every sequence starts with it)."""
    from tokenizers import Tokenizer

    from .data import BOS

    tok = Tokenizer.from_file(str(tokenizer_path))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if tok.token_to_id(BOS) is not None:
        config["bos_token"] = BOS
    return config


def save_tokenizer(tokenizer_path: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """Copy a tokenizer.json into `folder` and write the tokenizer_config.json beside it, so that
    `transformers.AutoTokenizer.from_pretrained(folder)` gives exactly minigate's ids (see `tokenizer_config`)."""
    folder, src = Path(folder), Path(tokenizer_path)
    if not src.is_file():
        raise FileNotFoundError(f"no tokenizer at {src}; pass the tokenizer.json the model was trained with "
                                "(e.g. data/tokenizer.json)")
    folder.mkdir(parents=True, exist_ok=True)
    config = tokenizer_config(src)
    if not (folder / "tokenizer.json").exists() or not src.samefile(folder / "tokenizer.json"):
        atomic_write(folder / "tokenizer.json", lambda f: f.write(src.read_bytes()))
    atomic_write(folder / "tokenizer_config.json", lambda f: f.write((json.dumps(config, indent=2) + "\n").encode()))
    return folder


def _resolve_folder(path_or_repo_id: str | os.PathLike, subfolder: str | None, revision: str | None = None,
                    cache_dir: str | os.PathLike | None = None, token: str | bool | None = None) -> Path:
    """A local folder if it exists, else download (only `subfolder`, at `revision`) from the Hugging Face Hub."""
    local = Path(path_or_repo_id).expanduser() / (subfolder or "")
    if local.is_dir():
        return local
    text = str(path_or_repo_id)
    looks_local = (isinstance(path_or_repo_id, os.PathLike) or text.startswith((".", "/", "~", "\\"))
                   or text.count("/") != 1 or Path(text.split("/")[0]).is_dir() or Path(text).exists())
    if looks_local:  # a Hub id is exactly "owner/name"; anything else is a local path that is not there
        raise FileNotFoundError(f"no folder {local} (relative paths start at {Path.cwd()}); check the path"
                                f"{f' and subfolder={subfolder!r}' if subfolder else ''}")
    from huggingface_hub import snapshot_download

    patterns = [f"{subfolder}/*"] if subfolder else None
    try:
        root = snapshot_download(str(path_or_repo_id), allow_patterns=patterns, etag_timeout=10, revision=revision,
                                 cache_dir=cache_dir, token=token)
    except Exception as e:  # offline, unknown repo, no access: one clear message instead of a stack of retries
        raise FileNotFoundError(
            f"{path_or_repo_id!r} is neither a local folder (relative paths start at {Path.cwd()}) nor a Hugging "
            f"Face Hub repo that could be downloaded{f' with subfolder {subfolder!r}' if subfolder else ''}"
            f"{f' at revision {revision!r}' if revision else ''} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). A local run? Check the path. "
            "No network? Download the folder on a machine that has one and pass its local path instead.") from None
    folder = Path(root) / (subfolder or "")
    if not folder.is_dir():
        raise FileNotFoundError(f"{path_or_repo_id!r} has no subfolder {subfolder!r}")
    return folder


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights, with a one-line ValueError naming the file when one is truncated or not a weights file."""
    try:
        return _read_weight_files(folder)
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError, json.JSONDecodeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"the weights in {folder} are damaged or incomplete ({reason}); copy or download the "
                         "folder again (an interrupted copy or a full disk leaves a truncated file)") from None


def _read_weight_files(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, sharded safetensors (with an index), or pytorch_model.bin (sharded or not)."""
    if (folder / "model.safetensors").exists():
        return load_file(folder / "model.safetensors")
    for index_name, loader in [("model.safetensors.index.json", lambda f: load_file(f)),
                               ("pytorch_model.bin.index.json",
                                lambda f: torch.load(f, map_location="cpu", weights_only=True, mmap=True))]:
        if (folder / index_name).exists():
            shards = sorted(set(json.loads((folder / index_name).read_text())["weight_map"].values()))
            out = {}
            for shard in shards:
                out.update(loader(folder / shard))
            return out
    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True)
    raise FileNotFoundError(f"no weights in {folder}: expected model.safetensors, a sharded safetensors index, "
                            "or pytorch_model.bin")


_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
                "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float64": torch.float64}


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch.bfloat16, or its name "bfloat16" / "torch.bfloat16" / "bf16"; a floating dtype only."""
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.removeprefix("torch.")]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"dtype={dtype!r}: use a floating torch dtype (torch.bfloat16), its name (\"bfloat16\", "
                     f"\"float16\", \"float32\"), or \"auto\" (from_pretrained: the dtype stored in the weights)")


def _stored_dtype(weights: dict[str, torch.Tensor]) -> torch.dtype:
    """dtype="auto": the dtype the checkpoint stores its floating weights in (the most common one)."""
    counts: dict[torch.dtype, int] = {}
    for t in weights.values():
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def from_pretrained(path_or_repo_id: str | os.PathLike, subfolder: str | None = None,
                    dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu",
                    revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                    token: str | bool | None = None) -> Transformer:
    """Load a minigate model from an official-format folder or Hub repo.

    dtype: float32 when None; "auto" keeps the dtype stored in the weights (bf16 for the paper's 1B models);
    a torch dtype or its name ("bfloat16", "float16"). revision (a commit hash, branch or tag: pin it for
    results that do not move), cache_dir and token go to huggingface_hub.snapshot_download; a local folder
    never falls through to the Hub."""
    if dtype is not None and dtype != "auto":
        dtype = _as_dtype(dtype)
    folder = _resolve_folder(path_or_repo_id, subfolder, revision=revision, cache_dir=cache_dir, token=token)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} has no config.json")
    try:
        cfg = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{folder / 'config.json'}: {str(e).splitlines()[0]}") from None
    official = _read_weights(folder)
    if dtype == "auto":
        dtype = _stored_dtype(official)

    with torch.device("meta"):  # no random init: the checkpoint's tensors are assigned below
        model = Transformer(cfg)
    expected = model.state_dict()
    state = {}
    for name, t in official.items():
        try:
            ours = _rename(name, to_official=False)
        except KeyError:
            raise ValueError(f"checkpoint parameter {name!r} has no place in a minigate model "
                             f"(config: gate={cfg.gate!r}, qk_norm={cfg.qk_norm}); is config.json right?") from None
        if ours == "lm_head.weight" and cfg.tie_embeddings:
            continue  # tied: the embedding matrix serves as the unembedding
        if ours not in expected:
            raise ValueError(f"checkpoint parameter {name!r} is not used by this config "
                             f"(gate={cfg.gate!r}, qk_norm={cfg.qk_norm}, sandwich_norm={cfg.sandwich_norm})")
        if tuple(t.shape) != tuple(expected[ours].shape):
            raise ValueError(f"shape mismatch for {name!r}: checkpoint has {tuple(t.shape)}, config.json implies "
                             f"{tuple(expected[ours].shape)} (check num_heads/head_dim/gate settings)")
        state[ours] = t.to(dtype or torch.float32)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} parameters, e.g. "
                         f"{[_rename(m, True) for m in missing[:3]]}; is config.json right?")
    model.load_state_dict(state, assign=True)
    return model.to(device).eval()
