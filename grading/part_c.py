"""The tests of part (c): the vanilla model, and finetuning it without pretraining."""

from suite import check_architecture, check_params, check_settings, test


@test(
    "(c) the vanilla model: the handout's architecture",
    2,
    probes=['finetune'],
    hint=(
        "check new_model (part c): GPTConfig(vocab_size, block_size, n_layer=4, "
        "n_head=8, n_embd=256) and model.GPT"
    ),
)
def vanilla_architecture(g):
    check_architecture(g.probe('finetune')['shapes'], g.architecture('vanilla'), 'the model')


@test(
    "(c) finetuning without pretraining: the handout's Trainer settings",
    2,
    probes=['finetune'],
    hint=(
        "check finetune (part c): 75 epochs without --reading_params_path, batch 256, "
        "args.finetune_lr, lr_decay, warmup_tokens 512*20, final_tokens "
        "200*len(pretrain_dataset)*block_size"
    ),
)
def finetune_settings(g):
    check_settings(g.probe('finetune')['config'], g.settings(75, 256, 6e-4, 200))


@test("(c) vanilla.model.params loads into the handout's vanilla model", 1)
def vanilla_model_params(g):
    check_params(g, 'vanilla.model.params', 'vanilla')
