"""Write the GPT-2 fixture of cartage-nn's tests with the `transformers` library.

A small GPT-2 (2 layers, width 64, 4 heads, context 32, vocabulary 96) with random weights of
a useful size (normal, std 0.1; layer-norm weights near 1) is saved by `save_pretrained` as
`config.json` and `model.safetensors`, and `expected.safetensors` holds a fixed prompt, the
model's f32 logits for it (eager attention, evaluation mode) and its greedy continuation.

Usage: python3 gpt2_fixture.py OUT_DIR
"""

import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel


def main(out: str) -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=96,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
    )
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    prompt = torch.tensor([[5, 17, 42, 3, 88, 61, 0, 29, 95, 12]], dtype=torch.long)
    with torch.no_grad():
        logits = model(prompt).logits.float()
        generated = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
        )
    save_file(
        {"prompt": prompt.contiguous(), "logits": logits.contiguous(), "generated": generated.contiguous()},
        f"{out}/expected.safetensors",
    )
    print("torch", torch.__version__, "logits", tuple(logits.shape), "generated", generated.tolist())


if __name__ == "__main__":
    main(sys.argv[1])
