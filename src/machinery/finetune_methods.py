"""Parameter-efficient finetuning: train a few new weights on top of a frozen pretrained
GPT instead of all of its weights (run.py's --finetune_method; full trains everything).

  lora     LoRA (Hu et al. 2021) as microsoft's loralib and Hugging Face's peft write it:
           each nn.Linear of the Transformer blocks (attention and MLP; not the embeddings
           or the head) computes x W^T + b + (x A^T B^T) alpha/r, with A (r, in)
           Kaiming-uniform and B (out, r) zero, so training starts at the pretrained model.
           The params written merge it (W + B A alpha/r): a plain state_dict.
  adapter  Bottleneck adapters (Houlsby et al. 2019): each block's attention and MLP output
           h becomes h + up(gelu(down(h))), up zero so training starts at the pretrained
           model. They cannot merge: the params keep their names (...attn.adapter.down.weight),
           and add_adapters rebuilds them to load such a file.

Only the new parameters train (requires_grad); the trainer's optimizer takes those only.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

METHODS = ('full', 'lora', 'adapter')
DEFAULTS = dict(lora_rank=8, lora_alpha=8.0, adapter_size=16)  # for flags left out
# --finetune_lr's default: the handout's for full; for the few new weights, the best of
# 6e-4, 2e-3, 6e-3 and 2e-2 on a held-out fifth of the finetuning file (results/README.md)
LEARNING_RATES = {'full': 6e-4, 'lora': 6e-3, 'adapter': 6e-3}


class LoRALinear(nn.Linear):
    """An nn.Linear with a trainable low-rank update; its weight and bias are the wrapped
    layer's own tensors, under the same names, so the pretrained params keep loading."""

    def __init__(self, linear, rank, alpha):
        nn.Module.__init__(self)  # not nn.Linear's: that would allocate a new weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        like = dict(dtype=self.weight.dtype, device=self.weight.device)
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **like))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **like))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as loralib and peft
        self.scaling = alpha / rank

    def forward(self, x):
        update = (x @ self.lora_A.T) @ self.lora_B.T  # (..., r) then (..., out)
        return F.linear(x, self.weight, self.bias) + update * self.scaling

    def merged_weight(self):
        return self.weight + (self.lora_B @ self.lora_A) * self.scaling  # (out, in)


class Adapter(nn.Module):
    """h + up(gelu(down(h))): a bottleneck of `size` features beside the identity."""

    def __init__(self, n_embd, size):
        super().__init__()
        self.down = nn.Linear(n_embd, size)
        self.up = nn.Linear(size, n_embd)
        nn.init.normal_(self.down.weight, std=0.02)  # as the GPT's own linears
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)  # the adapter starts as the identity
        nn.init.zeros_(self.up.bias)

    def forward(self, h):
        return h + self.up(F.gelu(self.down(h)))  # (..., C)


def add_arguments(group, positive):
    """run.py's --finetune_method and its options, left out as None (see DEFAULTS);
    positive(int) and positive(float) are the argument types of positive numbers."""
    group.add_argument(
        '--finetune_method',
        choices=METHODS,
        default='full',
        help="what finetuning trains: every weight (full, the handout's), or only LoRA's "
        "low-rank updates or bottleneck adapters on the frozen pretrained model",
    )
    group.add_argument(
        '--lora_rank', type=positive(int), help="rank r of the LoRA updates (default 8)"
    )
    group.add_argument(
        '--lora_alpha',
        type=positive(float),
        help="LoRA's alpha: the updates are scaled by alpha/r (default 8)",
    )
    group.add_argument(
        '--adapter_size', type=positive(int), help="features in each adapter (default 16)"
    )


def settings(args):
    """{lora_rank, lora_alpha, adapter_size} from run.py's flags, DEFAULTS where left out."""
    return {
        k: default if getattr(args, k) is None else getattr(args, k)
        for k, default in DEFAULTS.items()
    }


def apply(model, method, lora_rank, lora_alpha, adapter_size):
    """Freezes the (pretrained) model and adds the method's trainable weights; full leaves
    it as it is. Call after loading the pretrained params and before training."""
    if method == 'full':
        return
    for p in model.parameters():
        p.requires_grad_(False)
    if method == 'lora':
        add_lora(model, lora_rank, lora_alpha)
    else:
        add_adapters(model, adapter_size)


def block_linears(model):
    """(parent, child name, nn.Linear) for each linear layer of the Transformer blocks."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and parent is not model  # the head is model.head
    ]


def add_lora(model, rank, alpha):
    for parent, name, linear in block_linears(model):
        setattr(parent, name, LoRALinear(linear, rank, alpha))


def sublayers(model):
    """The attention and MLP of each block (the perceiver's down and up blocks too)."""
    blocks = [m for m in model.modules() if hasattr(m, 'attn') and hasattr(m, 'mlp')]
    return [sub for block in blocks for sub in (block.attn, block.mlp)]


def add_adapters(model, size):
    """An Adapter on the output of each sublayer, as its child `adapter`: the MLP (an
    nn.Sequential) runs it as its last layer, an attention through a forward hook."""
    for sublayer in sublayers(model):
        sublayer.adapter = Adapter(model.tok_emb.embedding_dim, size).to(model.tok_emb.weight)
        if not isinstance(sublayer, nn.Sequential):
            sublayer.register_forward_hook(_run_adapter)


def _run_adapter(sublayer, inputs, output):
    return sublayer.adapter(output)


def merge_lora(state, model):
    """`state` (model's state_dict) with each LoRA update folded into its weight, under the
    plain model's names: what every command loads. Other states are returned unchanged."""
    state = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            del state[f'{name}.lora_A'], state[f'{name}.lora_B']
            state[f'{name}.weight'] = module.merged_weight().detach().to(state[f'{name}.weight'])
    return state


def adapter_size(state):
    """The adapters' bottleneck size in a state_dict, or None when it holds none."""
    for name, tensor in state.items():
        if name.endswith('.adapter.down.weight') and tensor.dim() == 2:
            return tensor.size(0)  # (size, C)
    return None


def describe_parameters(gpt, method):
    """'N parameters', and how many of them train when not all do."""
    total = sum(p.numel() for p in gpt.parameters())
    trainable = sum(p.numel() for p in gpt.parameters() if p.requires_grad)
    if trainable == total:
        return f"{total:,} parameters"
    return (
        f"{total:,} parameters, {trainable:,} of them trained ({trainable / total:.2%}: {method})"
    )


def describe(method, lora_rank, lora_alpha, adapter_size):
    """The method as the start line and a resumed run's check show it."""
    if method == 'lora':
        return f"LoRA rank {lora_rank}, alpha {lora_alpha:g}"
    if method == 'adapter':
        return f"adapters of size {adapter_size}"
    return 'full'
