"""The default's mechanisms, each with the overrides that take it out alone (docs/default.md reads this table).

    python bench/bench_quality.py --budget 300 --seeds 1 2 3 --reference default --recipes default no_rope ...
    python bench/bench_quality.py --budget 300 --seeds 1 2 3 --reference default --recipes leave_one_out

Each `no_*` recipe is today's default less one mechanism, trained for the same whole-process wall-clock,
so a mechanism that makes a step slower pays for it in steps.
"""

if __name__ == "__main__":
    raise SystemExit(
        "error: bench/leave_one_out.py is a module of bench/bench_quality.py; run: "
        "python bench/bench_quality.py --recipes leave_one_out"
    )

LEAVE_ONE_OUT: dict[str, list[str]] = {
    # learned positions cannot read past what they trained on, so they train on the whole context
    "no_rope": ["model.pos_encoding=learned", "model.train_block_size=null"],
    "no_qk_norm": ["model.qk_norm=false"],
    "no_attn_gate": ["model.attn_gate=null"],
    "no_untied_head": ["model.tie_embeddings=true"],
    "no_x0_mix": ["model.x0_mix=false"],
    "no_windows": ["model.window_pattern=L"],
    "no_short_training": ["model.block_size=128"],
    "no_bigram": ["model.bigram_embeds=0"],
    "no_pointer": ["model.pointer_weight=0"],
    "no_learned_bpe": ["data=shakespeare"],
    "no_bpe_dropout": ["data.bpe_dropout=0"],
    "no_muon": ["optim=adamw"],
    "no_embedding_lr": ["optim.embedding_lr=null"],
    "no_wsd": ["optim.schedule=cosine"],
    "no_ema": ["optim.average_from=null"],
    "no_compile": ["compile=false"],
}
