#!/usr/bin/python3
"""make_cases.py: Transformer-XL parity cases (two segments, memories carried) with memory tokens,
from x-transformers 0.23.0, 1.29.2 and 2.26.4 themselves, in the `xl` format of ../shared/parity (its compare.py grades
them as is; README there: `tokens`, `tokens2`, `targets2` in; `logits`, `mems.<l>`, `logits2`,
`mems2.<l>`, `loss`, `grad.<name>` out), plus the .xtf of each case, written from the same
constructor.

    PYTHONPATH=DEPS /usr/bin/python3 tests/parity_xl/make_cases.py VERSION XT_DIR [OUT_DIR]

XT_DIR holds x_transformers of VERSION exported by git archive at the commit below (0.23.0: and
entmax 4a9eb7f1a29920bf0aebfe3ad04f6d2ef44d3df7); DEPS the dependencies ../shared/xt-newer/README.md
exports (einops 0.8.2; for 2.26.4 also einx, torch_einops_utils; 2.26.4 imports xt2_shim.py from
there first). Debian: python3-torch. One version per process; 1.29.2's cases are named v1_*, 2.26.4's
v2_*, and their .xtf start with xtransformers = "VERSION".

Every case: CPU, float32, eval(), one thread, torch.manual_seed(seed), the library's init plus
N(0, 0.02) noise on every parameter. Segment 1: logits, mems = model(tokens, return_mems=True);
segment 2: logits2, mems2 = model(tokens2, mems=mems, return_mems=True); the loss is segment 2's
cross-entropy against targets2 = its next tokens (-100 at the last position)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, '..', '..', '..', 'shared'))
if not os.path.isdir(os.path.join(SHARED, 'parity')):
    SHARED = '/work/shared'
VERSIONS = {'0.23.0': ('', '75d723ba14103ea9664b6980c3c502b5d2700d13'),
            '1.29.2': ('v1_', '58fb0262d026250edc9de86e6a631e7a890de31e'),
            '2.26.4': ('v2_', '9252ed7838021ee61e6c5be0930b3a9a88efdf06')}

# name: (versions, description, wrapper kwargs, layers kwargs, n1, n2)
OLD = ('0.23.0',)
NEWER = ('1.29.2', '2.26.4')
CASES = [
    ('xl_memory_tokens', OLD, 'Transformer-XL with 2 memory tokens: each layer input is M+n long with the memory '
     'tokens first, and mems keep its last max_mem_len = 6 rows, memory tokens included (segment 1: 2+5 '
     'rows cropped to 6); segment 2 attends to mems, then its own memory tokens, then its tokens',
     dict(num_tokens=32, max_seq_len=16, max_mem_len=6, num_memory_tokens=2),
     dict(dim=16, depth=2, heads=2, attn_dim_head=8), 5, 4),
    ('xl_memory_tokens_rotary', OLD, 'as xl_memory_tokens with rotary positions (over mems + M + n; memory '
     'tokens take the first of each call) and max_mem_len 12: segment 1 keeps all 3+6 rows, segment 2 '
     'the last 12 of 9+3+5', dict(num_tokens=32, max_seq_len=16, max_mem_len=12, num_memory_tokens=3),
     dict(dim=32, depth=2, heads=2, attn_dim_head=32, rotary_pos_emb=True), 6, 5),
    ('xl_memory_tokens_gqa_rotary', NEWER, 'Transformer-XL with 2 memory tokens in 1.x/2.x: grouped '
     'key/values, rotary over mems + M + n (q and k only), RMSNorm, SwiGLU; max_mem_len 8: segment 1 '
     'keeps all 2+6 rows, segment 2 the last 8 of 8+2+5', dict(num_tokens=32, max_seq_len=16,
     max_mem_len=8, num_memory_tokens=2), dict(dim=16, depth=2, heads=4, attn_kv_heads=2,
     attn_dim_head=32, rotary_pos_emb=True, use_rmsnorm=True, ff_glu=True, ff_swish=True), 6, 5),
    ('xl_shift_mem_down', NEWER, 'Transformer-XL without memory tokens, shift_mem_down 1 (layer l '
     'reads the memories of layer l + 1, rotated), absolute positions, max_mem_len 5',
     dict(num_tokens=32, max_seq_len=16, max_mem_len=5, shift_mem_down=1),
     dict(dim=16, depth=2, heads=2, attn_dim_head=8), 4, 3),
]


def pyval(v):
    return 'True' if v is True else 'False' if v is False else repr(v)


def xtfval(v):
    return 'true' if v is True else 'false' if v is False else repr(v)


def main(version, xt, out):
    prefix, commit = VERSIONS[version]
    sys.path[:0] = [os.path.join(SHARED, 'parity'), xt]
    if version.startswith('2.'):
        sys.path.insert(0, os.path.join(SHARED, 'xt-newer'))
        import xt2_shim  # noqa: F401  (before torch)
    import torch
    import torch.nn.functional as F
    import safetensors_lite as st
    import x_transformers
    torch.set_num_threads(1)

    def tensor(t):
        t = t.detach().contiguous()
        if t.dtype == torch.int64:
            return st.Tensor('I64', list(t.shape), t.flatten().tolist())
        return st.Tensor('F32', list(t.shape), t.float().flatten().tolist())

    for seed, (name, versions, desc, w, lk, n1, n2) in enumerate(CASES):
        if version not in versions:
            continue
        name = prefix + name
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(2000 + seed)
        model = x_transformers.TransformerWrapper(**w, attn_layers=x_transformers.Decoder(**lk))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        model.eval()
        b, V = 2, w['num_tokens']
        tokens = torch.randint(0, V, (b, n1))
        tokens2 = torch.randint(0, V, (b, n2))
        targets2 = torch.full((b, n2), -100, dtype=torch.long)
        targets2[:, :-1] = tokens2[:, 1:]
        logits, mems = model(tokens, return_mems=True)
        mems = [m.detach() for m in mems]  # 2.x detaches only with detach_mems
        logits2, mems2 = model(tokens2, mems=mems, return_mems=True)
        logits2.retain_grad()
        loss = F.cross_entropy(logits2.transpose(1, 2), targets2, ignore_index=-100)
        loss.backward()

        sd = model.state_dict()
        params = dict(model.named_parameters())
        expected = {'logits': tensor(logits), 'logits2': tensor(logits2), 'loss': tensor(loss),
                    'grad.logits2': tensor(logits2.grad)}
        for l, (m1, m2) in enumerate(zip(mems, mems2)):
            expected['mems.%d' % l] = tensor(m1)
            expected['mems2.%d' % l] = tensor(m2)
        for k in sd:
            if k in params:
                g = params[k].grad
                expected['grad.' + k] = tensor(g if g is not None else torch.zeros_like(params[k]))
        config = {'description': desc, 'wrapper': 'TransformerWrapper', 'wrapper_kwargs': w,
                  'attn_layers': 'Decoder', 'attn_layers_kwargs': lk, 'seed': 2000 + seed, 'batch': b,
                  'seq_len': n1, 'seq_len2': n2, 'xl_segments': 2, 'perturb_std': 0.02}
        st.write(os.path.join(d, 'weights.safetensors'), {k: tensor(v) for k, v in sd.items()})
        st.write(os.path.join(d, 'inputs.safetensors'),
                 {'tokens': tensor(tokens), 'tokens2': tensor(tokens2), 'targets2': tensor(targets2)})
        st.write(os.path.join(d, 'expected.safetensors'), expected)
        with open(os.path.join(d, 'config.json'), 'w') as f:
            json.dump(config, f, indent=1)
        args = ', '.join('%s = %s' % (k, pyval(v)) for k, v in w.items())
        largs = ', '.join('%s = %s' % (k, pyval(v)) for k, v in lk.items())
        info = {'config': config, 'kind': 'xl', 'x_transformers_version': version,
                'x_transformers_commit': commit, 'torch_version': torch.__version__,
                'constructor': 'TransformerWrapper(%s, attn_layers = Decoder(%s))' % (args, largs),
                'loss_definition': 'next_token_ce of segment 2', 'num_mems': len(mems),
                'state_dict': {k: {'shape': list(v.shape), 'kind': 'param' if k in params else 'buffer'}
                               for k, v in sd.items()}}
        with open(os.path.join(d, 'case.json'), 'w') as f:
            json.dump(info, f, indent=1)
        lines = ['# %s (x-transformers %s): %s' % (name, version, desc)]
        lines += ['xtransformers = "%s"' % version] if prefix else []
        lines += ['', 'model = TransformerWrapper(']
        lines += ['    %s = %s,' % (k, xtfval(v)) for k, v in w.items()]
        lines.append('    attn_layers = Decoder(')
        lines += ['        %s = %s,' % (k, xtfval(v)) for k, v in lk.items()]
        lines += ['    ),', ')', '']
        with open(os.path.join(out, name + '.xtf'), 'w') as f:
            f.write('\n'.join(lines))
        print('%s: loss %.6f, mems %s, mems2 %s' % (name, loss.item(), list(mems[0].shape), list(mems2[0].shape)))


if __name__ == '__main__':
    if len(sys.argv) < 3 or sys.argv[1] not in VERSIONS:
        sys.exit(__doc__)
    main(sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else HERE)
