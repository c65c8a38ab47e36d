"""The tests of part (f): pretraining's and pretrained finetuning's Trainer settings, and
the pretrained vanilla model's params and predictions."""

from suite import ACCURACY, Fail, check_accuracy, check_params, check_settings, test


@test(
    "(f) pretraining: the handout's Trainer settings",
    7,
    probes=['pretrain'],
    hint=(
        "check pretrain (part f): 650 epochs, batch 128, args.pretrain_lr, lr_decay, "
        "warmup_tokens 512*20, final_tokens E*len(pretrain_dataset)*block_size with the "
        "edition's E"
    ),
)
def pretrain_settings(g):
    settings = g.settings(650, 128, 6e-3, g.edition['schedule'])
    check_settings(g.probe('pretrain')['config'], settings)


@test(
    "(f) finetuning from pretrained params: the handout's Trainer settings",
    4,
    probes=['finetune_pretrained'],
    hint="check finetune (part f): 10 epochs with --reading_params_path, otherwise as part c",
)
def finetune_pretrained_settings(g):
    check_settings(g.probe('finetune_pretrained')['config'], g.settings(10, 256, 6e-4, 200))


@test(
    "(f) finetuning from pretrained params starts from them",
    2,
    probes=['finetune_pretrained'],
    hint=(
        "check finetune (part f): load --reading_params_path into the model "
        "(load_state_dict) before the Trainer trains it"
    ),
)
def finetune_pretrained_loads(g):
    found = g.probe('finetune_pretrained')
    if found['loaded'] != found['given']:
        raise Fail(
            f"the model given to the Trainer holds {found['loaded']} of the "
            f"{found['given']} tensors of --reading_params_path"
        )


@test("(f) vanilla.finetune.params loads into the handout's vanilla model", 1)
def vanilla_finetune_params(g):
    check_params(g, 'vanilla.finetune.params', 'vanilla')


@test("(f) vanilla pretrained: dev accuracy at least {vanilla_dev}%", 5, hint=ACCURACY)
def vanilla_dev(g):
    check_accuracy(g, 'vanilla.pretrain.dev.predictions', 'dev', g.edition['vanilla_dev'])


@test("(f) vanilla pretrained: test predictions, one per question", 1)
def vanilla_test_lines(g):
    g.predictions('vanilla.pretrain.test.predictions', 'test')


@test(
    "(f) vanilla pretrained: test accuracy at least {vanilla_test}%", 8, answers=True, hint=ACCURACY
)
def vanilla_test(g):
    check_accuracy(g, 'vanilla.pretrain.test.predictions', 'test', g.edition['vanilla_test'])
