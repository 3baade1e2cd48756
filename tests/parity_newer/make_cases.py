#!/usr/bin/python3
"""make_cases.py: parity cases from x-transformers 1.29.2 and 2.26.4 themselves, in the format of
../shared/parity (its compare.py grades them as is), plus the .xtf of each case, written from the
same constructor with a first statement naming the version.

    /usr/bin/python3 tests/parity_newer/make_cases.py XTPY_DIR [OUT_DIR]

XTPY_DIR holds 1.29.2/x_transformers, 2.26.4/x_transformers and deps/{einops,einx,
torch_einops_utils} exported at the commits of ../shared/xt-newer/README.md (git archive); 2.26.4
imports ../shared/xt-newer/xt2_shim.py first (torch 1.13). Debian: python3-torch, python3-numpy,
python3-packaging, python3-loguru, python3-frozendict. Each version runs in its own process.

Every case: CPU, float32, eval(), one thread, torch.manual_seed(seed), the library's init plus
N(0, 0.02) noise on every parameter; loss = cross_entropy(logits, targets, ignore_index=-100)
with targets = next token where both positions are real. The softmax of 1.x/2.x runs in float32,
as everything here does."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.normpath(os.path.join(HERE, '..', '..', '..', 'shared'))
if not os.path.isdir(os.path.join(SHARED, 'parity')):
    SHARED = '/work/shared'

VERSIONS = {
    '1.29.2': ('v1', '58fb0262d026250edc9de86e6a631e7a890de31e'),
    '2.26.4': ('v2', '9252ed7838021ee61e6c5be0930b3a9a88efdf06'),
}

# name: (versions, description, wrapper kwargs, layers class, layers kwargs, mask lengths)
BASE = dict(dim=16, depth=1, heads=2, attn_dim_head=8)
W = dict(num_tokens=32, max_seq_len=8)
BOTH = ('1.29.2', '2.26.4')
CASES = [
    ('decoder_plain', BOTH, 'pre-norm decoder: bias-free LayerNorm (gamma), final_norm in attn_layers, '
     'no to_out / to_logits biases, ff.* names', W, 'Decoder', dict(BASE, depth=2), None),
    ('encoder_mask', BOTH, 'encoder with a padding mask: keys only are masked (padded query rows '
     'attend to the real keys)', W, 'Encoder', BASE, [8, 5]),
    ('rotary_pos_emb', BOTH, 'rotary on q and k only (not v); 1.x pairs (i, i + r/2), 2.x pairs '
     '(2i, 2i+1); rotary dim 32 of dim_head 64 rotates', W, 'Decoder', dict(BASE, attn_dim_head=64,
     rotary_pos_emb=True), None),
    ('rotary_small', ('2.26.4',), '2.x: rotary dim = dim_head // 2 = 4, no floor at 32', W, 'Decoder',
     dict(BASE, rotary_pos_emb=True), None),
    ('use_rmsnorm', BOTH, 'RMSNorm = normalize(x) * sqrt(d) * g, final norm RMSNorm too (2.x: stored '
     'g = gain - 1)', W, 'Decoder', dict(BASE, use_rmsnorm=True), None),
    ('use_scalenorm', BOTH, 'ScaleNorm, one gain', W, 'Decoder', dict(BASE, use_scalenorm=True), None),
    ('use_simple_rmsnorm', BOTH, 'SimpleRMSNorm: no gain, no keys', W, 'Decoder',
     dict(BASE, use_simple_rmsnorm=True), None),
    ('no_unit_offset', ('2.26.4',), '2.x norm_add_unit_offset=False: gains stored as they are', W,
     'Decoder', dict(BASE, norm_add_unit_offset=False), None),
    ('ff_glu', BOTH, 'GEGLU: ff.0.proj with bias, second half gates', W, 'Decoder',
     dict(BASE, ff_glu=True), None),
    ('ff_swiglu', BOTH, 'SwiGLU: ff_glu + ff_swish (SiLU gate)', W, 'Decoder',
     dict(BASE, ff_glu=True, ff_swish=True), None),
    ('ff_swish', BOTH, 'SiLU feed-forward without GLU', W, 'Decoder', dict(BASE, ff_swish=True), None),
    ('ff_no_bias', BOTH, 'ff_no_bias: the two Linears without bias', W, 'Decoder',
     dict(BASE, ff_no_bias=True), None),
    ('ff_glu_no_bias', BOTH, 'ff_no_bias with GLU: the GLU projection keeps its bias', W, 'Decoder',
     dict(BASE, ff_glu=True, ff_swish=True, ff_no_bias=True), None),
    ('ff_relu_squared', BOTH, 'relu(x)^2 feed-forward', W, 'Decoder',
     dict(BASE, ff_relu_squared=True), None),
    ('attn_kv_heads', BOTH, 'grouped-query attention: 4 query heads over 2 key/value heads, query '
     'head i reads key/value head i mod 2', W, 'Decoder', dict(BASE, heads=4, attn_kv_heads=2), None),
    ('attn_one_kv_head', BOTH, 'multi-query attention: one key/value head', W, 'Decoder',
     dict(BASE, heads=4, attn_one_kv_head=True), None),
    ('one_head', ('2.26.4',), '2.x with one head (dim_head == dim): no to_out', W, 'Decoder',
     dict(BASE, heads=1, attn_dim_head=16), None),
    ('tie_embedding', BOTH, 'logits = h @ token_emb.emb.weight^T', dict(W, tie_embedding=True),
     'Decoder', BASE, None),
    ('no_abs_pos_emb', BOTH, 'use_abs_pos_emb=False: no positions at all', dict(W, use_abs_pos_emb=False),
     'Decoder', BASE, None),
    ('gqa_swiglu_rms_rotary', BOTH, 'the acceptance model in small: attn_kv_heads, SwiGLU, RMSNorm, '
     'rotary, with a padding mask', W, 'Decoder', dict(BASE, depth=2, heads=4, attn_dim_head=32,
     attn_kv_heads=2, ff_swish=True, ff_glu=True, use_rmsnorm=True, rotary_pos_emb=True), [8, 6]),
    ('encoder_mqa_rotary_mask', BOTH, 'encoder: one key/value head, rotary, LayerNorm, padding mask',
     W, 'Encoder', dict(BASE, heads=4, attn_dim_head=32, attn_one_kv_head=True, rotary_pos_emb=True),
     [5, 8]),
    ('attn_qk_norm', BOTH, 'cosine-sim attention: l2-normalised q and k times the fixed '
     'qk_norm_scale 10, before rotary', W, 'Decoder', dict(BASE, attn_qk_norm=True), None),
    ('qk_norm_groups_scale', BOTH, 'qk-norm over 2 groups of each head, qk_norm_scale 8', W, 'Decoder',
     dict(BASE, attn_qk_norm=True, attn_qk_norm_groups=2, attn_qk_norm_scale=8), None),
    ('qk_norm_dim_scale', ('1.29.2',), '1.x qk_norm_dim_scale: learned per-feature q and k scales '
     '(per head), logits still times qk_norm_scale', W, 'Decoder',
     dict(BASE, attn_qk_norm=True, attn_qk_norm_dim_scale=True), None),
    ('qk_norm_dim_scale_gqa', ('2.26.4',), '2.x qk_norm_dim_scale with grouped key/values: k scales '
     'per key/value head, logits times dim_head^-0.5', W, 'Decoder',
     dict(BASE, heads=4, attn_kv_heads=2, attn_qk_norm=True, attn_qk_norm_dim_scale=True), None),
    ('attn_gate_values', BOTH, 'gated values: out * sigmoid(to_v_gate(x)) (bias in 1.x, none in 2.x)',
     W, 'Decoder', dict(BASE, attn_gate_values=True), None),
    ('qk_norm_rotary_mqa_mask', BOTH, 'qk-norm with rotary, one key/value head, gated values and a '
     'padding mask', W, 'Decoder', dict(BASE, heads=4, attn_dim_head=32, attn_one_kv_head=True,
     attn_qk_norm=True, rotary_pos_emb=True, attn_gate_values=True), [8, 7]),
    ('rotary_xpos', BOTH, 'rotary_xpos: rotated q times scale^((p - n // 2) / scale_base), k divided by '
     'it, scale = (2i + 0.4 rd) / (1.4 rd) per pair; scale_base 4 so that it shows in 8 positions',
     W, 'Decoder', dict(BASE, attn_dim_head=64, rotary_xpos=True, rotary_xpos_scale_base=4), None),
    ('xpos_gqa_qk_norm_mask', BOTH, 'rotary_xpos after qk-norm (the scores are no longer bounded by '
     'the scale), grouped key/values and a padding mask', W, 'Decoder', dict(BASE, heads=4,
     attn_dim_head=32, attn_kv_heads=2, attn_qk_norm=True, rotary_xpos=True,
     rotary_xpos_scale_base=6), [8, 6]),
]


def pyval(v):
    return 'True' if v is True else 'False' if v is False else repr(v)


def xtfval(v):
    return 'true' if v is True else 'false' if v is False else repr(v)


def constructor(w, cls, lk):
    args = ', '.join('%s = %s' % (k, pyval(v)) for k, v in w.items())
    largs = ', '.join('%s = %s' % (k, pyval(v)) for k, v in lk.items())
    return 'TransformerWrapper(%s, attn_layers = %s(%s))' % (args, cls, largs)


def write_xtf(path, version, name, desc, w, cls, lk):
    lines = ['# %s (x-transformers %s): %s' % (name, version, desc),
             'xtransformers = "%s"' % version, '', 'model = TransformerWrapper(']
    lines += ['    %s = %s,' % (k, xtfval(v)) for k, v in w.items()]
    lines.append('    attn_layers = %s(' % cls)
    lines += ['        %s = %s,' % (k, xtfval(v)) for k, v in lk.items()]
    lines += ['    ),', ')', '']
    with open(path, 'w') as f:
        f.write('\n'.join(lines))


def run_version(xtpy, version, out):
    prefix, commit = VERSIONS[version]
    sys.path[:0] = [os.path.join(SHARED, 'parity'), os.path.join(xtpy, version), os.path.join(xtpy, 'deps')]
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
        if t.dtype == torch.bool:
            return st.Tensor('BOOL', list(t.shape), [int(x) for x in t.flatten().tolist()])
        if t.dtype == torch.int64:
            return st.Tensor('I64', list(t.shape), t.flatten().tolist())
        return st.Tensor('F32', list(t.shape), t.float().flatten().tolist())

    for seed, (name, versions, desc, w, cls, lk, mask_lengths) in enumerate(CASES):
        if version not in versions:
            continue
        case = '%s_%s' % (prefix, name)
        d = os.path.join(out, case)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(1000 + seed)
        layers = getattr(x_transformers, cls)(**lk)
        model = x_transformers.TransformerWrapper(**w, attn_layers=layers)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        model.eval()
        b, n, V = 2, w['max_seq_len'], w['num_tokens']
        tokens = torch.randint(0, V, (b, n))
        mask = None
        if mask_lengths:
            mask = torch.arange(n)[None, :] < torch.tensor(mask_lengths)[:, None]
        targets = torch.full((b, n), -100, dtype=torch.long)
        targets[:, :-1] = tokens[:, 1:]
        if mask is not None:
            targets[:, :-1][~(mask[:, :-1] & mask[:, 1:])] = -100
        logits = model(tokens, mask=mask) if mask is not None else model(tokens)
        logits.retain_grad()
        loss = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100)
        loss.backward()

        sd = model.state_dict()
        params = dict(model.named_parameters())
        weights = {k: tensor(v) for k, v in sd.items()}
        inputs = {'tokens': tensor(tokens), 'targets': tensor(targets)}
        if mask is not None:
            inputs['mask'] = tensor(mask)
        expected = {'logits': tensor(logits), 'loss': tensor(loss), 'grad.logits': tensor(logits.grad)}
        for k in sd:
            if k in params:
                g = params[k].grad
                expected['grad.' + k] = tensor(g if g is not None else torch.zeros_like(params[k]))
        config = {'description': desc, 'wrapper': 'TransformerWrapper', 'wrapper_kwargs': w,
                  'attn_layers': cls, 'attn_layers_kwargs': lk, 'seed': 1000 + seed, 'batch': b,
                  'seq_len': n, 'perturb_std': 0.02}
        if mask_lengths:
            config['mask_lengths'] = mask_lengths
        meta = {'x_transformers_commit': commit, 'config': json.dumps(config)}
        st.write(os.path.join(d, 'weights.safetensors'), weights, meta) if _takes_meta(st) else \
            st.write(os.path.join(d, 'weights.safetensors'), weights)
        st.write(os.path.join(d, 'inputs.safetensors'), inputs)
        st.write(os.path.join(d, 'expected.safetensors'), expected)
        with open(os.path.join(d, 'config.json'), 'w') as f:
            json.dump(config, f, indent=1)
        info = {'config': config, 'constructor': constructor(w, cls, lk), 'kind': 'tokens',
                'x_transformers_version': version, 'x_transformers_commit': commit,
                'torch_version': torch.__version__, 'loss_definition': 'next_token_ce',
                'state_dict': {k: {'shape': list(v.shape), 'kind': 'param' if k in params else 'buffer'}
                               for k, v in sd.items()},
                'num_params': sum(p.numel() for p in model.parameters())}
        with open(os.path.join(d, 'case.json'), 'w') as f:
            json.dump(info, f, indent=1)
        write_xtf(os.path.join(out, case + '.xtf'), version, case, desc, w, cls, lk)
        print('%s: loss %.6f, %d parameters' % (case, loss.item(), info['num_params']))


def _takes_meta(st):
    import inspect
    return len(inspect.signature(st.write).parameters) > 2


if __name__ == '__main__':
    if len(sys.argv) > 2 and sys.argv[1] == '--version':
        run_version(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    xtpy = os.path.abspath(sys.argv[1])
    out = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else HERE
    for v in VERSIONS:
        subprocess.check_call([sys.executable, os.path.abspath(__file__), '--version', xtpy, v, out])
