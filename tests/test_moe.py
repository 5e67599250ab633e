"""The mixture-of-experts feed-forward (moe.py): transformers' Qwen3-MoE checkpoints load with the same logits and
minigate's MoE folders load in transformers, the router learns, its hooks and load-balancing loss, the G1 gate on
top, and config errors that name the field."""

import dataclasses

import pytest
import torch

import minigate
from minigate import ModelConfig, Transformer
from minigate.config import ConfigError

MOE = dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)  # the tiny model's experts (conftest.py)


def _perturbed(model):
    """Every weight moved, the router's too (transformers starts it at zero: every expert tied), so each token picks
    its own experts and a wrong weight or routing shows in the logits."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.data.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_a_transformers_qwen3_moe_folder_gives_the_same_logits(tmp_path, norm_topk_prob, tiny_hf):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    hf = _perturbed(Qwen3MoeForCausalLM(Qwen3MoeConfig(**tiny_hf, **MOE, norm_topk_prob=norm_topk_prob)))
    hf.save_pretrained(tmp_path)
    ours = minigate.from_pretrained(tmp_path)
    assert (ours.cfg.n_experts, ours.cfg.n_experts_per_token, ours.cfg.expert_width) == (4, 2, 16)
    tokens = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = hf(tokens).logits, ours(tokens)
    diff = (got - want).abs().max().item()
    print(f"Qwen3-MoE (norm_topk_prob={norm_topk_prob}) through minigate: max |logit difference| {diff:.2e}")
    assert diff <= 1e-4
    assert ModelConfig.from_hf_config(ours.cfg.to_hf_config()) == ours.cfg  # config.json round-trips
    _, cache = ours.run_with_cache(tokens)
    ids = cache["blocks.1.mlp.hook_expert_ids"]  # (batch, pos, k): different tokens, different experts
    assert ids.shape == (3, 17, 2) and len(set(ids[..., 0].flatten().tolist())) > 1
    probs = cache["blocks.1.mlp.hook_router_probs"]  # (batch, pos, expert)
    assert probs.shape == (3, 17, 4) and torch.allclose(probs.sum(-1), torch.ones(3, 17))
    assert torch.equal(ids[..., 0], probs.argmax(-1))  # the first of the k is the most probable expert


def test_a_minigate_moe_folder_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                      n_experts=4, n_experts_per_token=2, d_expert=16)
    ours = _perturbed(Transformer(cfg))
    minigate.save_pretrained(ours, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    tokens = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (hf(tokens).logits - ours(tokens)).abs().max() <= 1e-4


def test_the_router_learns_and_the_balance_loss_reads_the_load():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16,
                                    n_experts=4, n_experts_per_token=2, d_expert=16))
    tokens = torch.randint(0, 64, (2, 9))
    logits, aux_loss = model(tokens, return_aux_loss=True)
    assert torch.equal(logits, model(tokens))  # the same logits, with or without the balance loss
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).backward()
    moe = model.blocks[0].mlp
    assert moe.router.weight.grad.abs().sum() > 0  # through the top-k weights, the router gets a gradient
    assert sum(e.down_proj.weight.grad is not None for e in moe.experts) >= 2  # each token's k=2 experts learn
    assert 1.0 - 1e-5 <= aux_loss.item() <= 4.0  # 1: perfectly balanced; n_experts: one expert takes all
    normed = model.blocks[0].mlp_norm(model.embed(tokens))
    with torch.no_grad():  # one expert's router row made huge: it takes every token and the loss nears n_experts
        moe.router.weight[2] = 0
        moe.router.weight[2, :] += 50 * torch.sign(normed).mean((0, 1))
        assert model(tokens, return_aux_loss=True)[1].item() > 1.5
    assert not hasattr(moe, "aux_loss") and not hasattr(model, "aux_loss")  # no state left between calls
    dense = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16))
    assert dense(tokens, return_aux_loss=True)[1].item() == 0.0


@pytest.mark.slow
def test_the_g1_gate_works_unchanged_on_an_moe_model(tmp_path):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, gate="G1",
                      gate_granularity="headwise", n_experts=4, d_expert=16)
    model = _perturbed(Transformer(cfg))
    minigate.save_pretrained(model, tmp_path)
    back = minigate.from_pretrained(tmp_path)
    tokens = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert torch.equal(back(tokens), model(tokens))
    _, cache = back.run_with_cache(tokens)
    assert cache["blocks.0.attn.hook_gate"].shape == (2, 10, 4) and "blocks.0.mlp.hook_router_probs" in cache


@pytest.mark.parametrize("kw, field", [(dict(n_experts=4, n_experts_per_token=5), "n_experts_per_token"),
                                       (dict(n_experts=-1), "n_experts"), (dict(n_experts=4, d_expert=1.5), "d_expert"),
                                       (dict(n_experts=4, norm_topk_prob=1), "norm_topk_prob")])
def test_a_bad_moe_field_is_named(kw, field):
    with pytest.raises(ConfigError, match=f"ModelConfig.{field}=") as e:
        ModelConfig(**kw)
    assert e.value.field == field


def test_a_config_that_mixes_dense_and_moe_layers_is_refused():
    hf = ModelConfig(n_experts=4).to_hf_config()
    with pytest.raises(ValueError, match="decoder_sparse_step / mlp_only_layers"):
        ModelConfig.from_hf_config(dict(hf, mlp_only_layers=[0]))


@pytest.mark.slow
def test_training_an_moe_model_adds_and_records_the_balance_loss(tmp_path):
    from minigate.presets import TrainConfig
    from minigate.train import train

    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16, n_experts=4,
                      d_expert=16, max_seq_len=16)
    tokens = torch.randint(1, 64, (4000,), generator=torch.Generator().manual_seed(0))
    train_cfg = TrainConfig(steps=6, batch_size=4, seq_len=16, warmup_steps=1, eval_every=6, eval_batches=1,
                            device="cpu", precision="fp32", router_aux_loss_coef=0.5)
    torch.manual_seed(0)
    history = train(Transformer(cfg), tokens[:3000], tokens[3000:], train_cfg, out_dir=tmp_path / "run", progress=False)
    assert len(history.aux_loss) == len(history.step) == 6 and all(1 - 1e-5 <= a <= 4 for a in history.aux_loss)
    torch.manual_seed(0)
    off = train(Transformer(cfg), tokens[:3000], tokens[3000:],
                dataclasses.replace(train_cfg, router_aux_loss_coef=0.0), progress=False)
    assert off.loss[0] == history.loss[0] and off.loss[-1] != history.loss[-1]  # the coefficient steers training
    dense = train(Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2,
                                          head_dim=16, max_seq_len=16)), tokens[:3000], tokens[3000:], train_cfg,
                  progress=False)
    assert dense.aux_loss == []  # a dense model records none
