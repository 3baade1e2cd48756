#!/usr/bin/env python3
"""cases.py OUT_DIR [CASE...]: writes the combination cases of the PyTorch reference (xt_ref.py).

Each case is a tiny model that mixes several x-transformers options per layer. For each one
OUT_DIR/<case>/ gets:
  <case>.xtf                 the model in xtc's language, generated from the same description
  weights.safetensors        every parameter and buffer by state_dict name (F32)
  inputs.safetensors         named inputs (DESIGN.md "Module interface"), F32 / I64 / BOOL
  expected.safetensors       outputs, loss and grad.<param> of the float64 reference (F64)
  stages                     one line per xtc run: INPUTS EXPECTED grads|nograds
Transformer-XL cases have a stage per segment: segment 1 (inputs/expected: logits, mems.<l>),
segment 2 (inputs2/expected2, with the loss and gradients) and, with seq_len3, segment 3
(inputs3/expected3, likewise); the mems.<l> inputs of each are the reference's mems of the
segment before, so every segment is graded on its own. Models without a built-in loss (ViT, continuous) get
their loss mean(out * loss_weights) as the input grad.<output> = loss_weights / numel.

Needs /usr/bin/python3 with Debian's python3-torch; writes files with
../shared/parity/safetensors_lite.py (found through XTC_SHARED_DIR or beside the source tree).
"""
import os
import sys
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import xt_ref  # noqa: E402
from xt_ref import Call as C  # noqa: E402

SHARED = os.environ.get("XTC_SHARED_DIR") or os.path.join(HERE, "..", "..", "..", "shared")
sys.path.insert(0, os.path.join(SHARED, "parity"))
import safetensors_lite as st  # noqa: E402

# Every case: name, what it combines, the model, and how its inputs are drawn (batch, seq_len,
# mask_lengths: row r real for t < L, context_len, context_mask_lengths, src_len,
# src_mask_lengths, tgt_len, tgt_mask_lengths, seq_len2 and seq_len3 for more XL segments).
CASES = [
    dict(name="dec_rotary_rms_glu_talking_memkv_qknorm",
         about="causal, padded: rotary on q/k/v (dim_head 32, all of it rotates), RMSNorm, GEGLU, "
               "talking heads over 3 heads, 2 memory key/values (not rotated, visible to all), "
               "qk_norm with a learned temperature",
         model=C("TransformerWrapper", num_tokens=48, max_seq_len=16, attn_layers=C(
             "Decoder", dim=24, depth=2, heads=3, attn_dim_head=32, rotary_pos_emb=True,
             use_rmsnorm=True, ff_glu=True, ff_mult=2, attn_talking_heads=True,
             attn_num_mem_kv=2, attn_qk_norm=True)),
         batch=2, seq_len=10, mask_lengths=[10, 6]),
    dict(name="enc_relpos_mask_sandwich_scalenorm_relusq",
         about="bidirectional, padded: T5 bias (8 buckets, max distance 10: log and clamped "
               "buckets), sandwich_norm, scale_residual, ScaleNorm, relu^2 feed-forward with "
               "post-activation LayerNorm, head_scale",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=16, attn_layers=C(
             "Encoder", dim=20, depth=2, heads=2, attn_dim_head=16, rel_pos_bias=True,
             rel_pos_num_buckets=8, rel_pos_max_distance=10, sandwich_norm=True,
             scale_residual=True, use_scalenorm=True, ff_relu_squared=True, ff_post_act_ln=True,
             attn_head_scale=True)),
         batch=2, seq_len=12, mask_lengths=[12, 7]),
    dict(name="dec_macaron_gru_resattn_onattn_gates",
         about="macaron (f a f, FF halved), GRU gating with residual_scale, residual attention, "
               "attention-on-attention, head_scale, gated values, absolute positions",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=2, heads=2, attn_dim_head=16, macaron=True,
             gate_residual=True, scale_residual=True, residual_attn=True, attn_on_attn=True,
             attn_head_scale=True, attn_gate_values=True, ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 5]),
    dict(name="dec_cross_pia_ctxmask_resattn",
         about="a, c, f blocks: position-infused attention (self only), residual attention on "
               "'a' and cross_residual_attn on 'c', token mask (queries of 'c' too) and "
               "context_mask, gated values, talking heads",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=2, heads=2, attn_dim_head=16, cross_attend=True,
             position_infused_attn=True, residual_attn=True, cross_residual_attn=True,
             attn_gate_values=True, attn_talking_heads=True, ff_mult=2)),
         batch=2, seq_len=8, mask_lengths=[8, 5], context_len=7, context_mask_lengths=[4, 7]),
    dict(name="dec_memtok_rezero_sandwichcoef_macaron",
         about="3 memory tokens (mask padded, dropped before the logits), ReZero (no norms, "
               "keys under .fn, macaron FF under .fn.fn), sandwich_coef 1 with macaron "
               "(a, f a f, f), talking heads, 1 memory key/value",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, num_memory_tokens=3,
                 attn_layers=C("Decoder", dim=16, depth=2, heads=2, attn_dim_head=16,
                               use_rezero=True, sandwich_coef=1, macaron=True,
                               attn_talking_heads=True, attn_num_mem_kv=1, ff_mult=2)),
         batch=2, seq_len=8, mask_lengths=[8, 6]),
    dict(name="dec_custom_layers_cross_macaron",
         about="custom_layers ('a', 'c', 'f', 'f', 'a') with cross-attention and macaron "
               "(every FF halved), rotary, mask and context",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12,
                 attn_layers=C("Decoder", dim=16, depth=2, heads=2, attn_dim_head=32,
                               cross_attend=True, custom_layers=("a", "c", "f", "f", "a"),
                               macaron=True, rotary_pos_emb=True, ff_mult=2)),
         batch=2, seq_len=8, mask_lengths=[8, 6], context_len=5),
    dict(name="enc_par_ratio_relpos",
         about="par_ratio 4 over depth 4 (PAR: attention layers first, then feed-forwards), "
               "T5 relative positions, mask",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12,
                 attn_layers=C("Encoder", dim=16, depth=4, heads=2, attn_dim_head=16, par_ratio=4,
                               rel_pos_bias=True, rel_pos_num_buckets=8, rel_pos_max_distance=16,
                               ff_mult=2)),
         batch=2, seq_len=8, mask_lengths=[8, 5]),
    dict(name="xtransformer_masks_tied",
         about="XTransformer with src_mask and tgt_mask, tie_token_emb; encoder: T5 bias, 2 "
               "memory tokens, RMSNorm, GEGLU; decoder: rotary, cross_residual_attn, 2 memory "
               "key/values; loss over every target position",
         model=C("XTransformer", dim=24, tie_token_emb=True,
                 enc_num_tokens=32, enc_max_seq_len=12, enc_depth=1, enc_heads=2,
                 enc_attn_dim_head=16, enc_rel_pos_bias=True, enc_num_memory_tokens=2,
                 enc_use_rmsnorm=True, enc_ff_glu=True, enc_ff_mult=2,
                 dec_num_tokens=32, dec_max_seq_len=12, dec_depth=2, dec_heads=2,
                 dec_attn_dim_head=32, dec_rotary_pos_emb=True, dec_cross_residual_attn=True,
                 dec_attn_num_mem_kv=2, dec_ff_mult=2),
         batch=2, src_len=9, src_mask_lengths=[9, 5], tgt_len=8, tgt_mask_lengths=[8, 4]),
    dict(name="captioner_vit_decoder",
         about="EncoderDecoder(ViT encoder with GEGLU, attention-on-attention and ScaleNorm; "
               "cross-attending decoder with rotary, qk_norm, cross_residual_attn and relu^2): "
               "the image embeddings (cls token included) are the context; the ViT's mlp_head "
               "(num_classes 3) exists but gets no gradient",
         model=C("EncoderDecoder",
                 encoder=C("ViTransformerWrapper", image_size=8, patch_size=4, num_classes=3,
                           attn_layers=C(
                     "Encoder", dim=24, depth=1, heads=2, attn_dim_head=16, ff_glu=True,
                     attn_on_attn=True, use_scalenorm=True, ff_mult=2)),
                 decoder=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
                     "Decoder", dim=24, depth=2, heads=2, attn_dim_head=32, cross_attend=True,
                     rotary_pos_emb=True, attn_qk_norm=True, cross_residual_attn=True,
                     ff_relu_squared=True, ff_mult=2))),
         batch=2, seq_len=8, mask_lengths=[8, 6]),
    dict(name="continuous_mask_postnorm_resattn",
         about="ContinuousTransformerWrapper (project_in 8 -> 16, scaled absolute positions, "
               "project_out 16 -> 6, emb_dim accepted and ignored), padded, post-norm with "
               "use_qk_norm_attn (attention: post-branch and post-main norms), residual attention, talking heads over 4 heads, head_scale, post-act LayerNorm",
         model=C("ContinuousTransformerWrapper", max_seq_len=16, dim_in=8, dim_out=6, emb_dim=12,
                 attn_layers=C("Encoder", dim=16, depth=2, heads=4, attn_dim_head=8,
                               pre_norm=False, use_qk_norm_attn=True, residual_attn=True,
                               attn_talking_heads=True,
                               attn_head_scale=True, ff_post_act_ln=True, ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 5]),
    dict(name="enc_embdim_memtok_qknormattn_glu_relusq",
         about="emb_dim 12 -> dim 16 (positions scaled by emb_dim^-0.5, project_emb), 2 memory "
               "tokens, use_qk_norm_attn with qk_norm_attn_seq_len (attention: post-branch norm "
               "only), gated values, GLU with relu^2 gate, ff_mult 1.5, padded",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, emb_dim=12,
                 num_memory_tokens=2,
                 attn_layers=C("Encoder", dim=16, depth=2, heads=2, attn_dim_head=16,
                               use_qk_norm_attn=True, qk_norm_attn_seq_len=12,
                               attn_gate_values=True, ff_glu=True, ff_relu_squared=True,
                               ff_mult=1.5)),
         batch=2, seq_len=10, mask_lengths=[10, 4]),
    dict(name="crossattender_tied_memkv_qknormattn",
         about="CrossAttender (c, f only) with tied embeddings, use_qk_norm_attn, "
               "cross_residual_attn, 2 memory key/values in cross-attention (not masked by "
               "context_mask), talking heads, RMSNorm, token mask on the queries",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, tie_embedding=True,
                 attn_layers=C("CrossAttender", dim=24, depth=2, heads=2, attn_dim_head=16,
                               use_qk_norm_attn=True, cross_residual_attn=True,
                               attn_num_mem_kv=2, attn_talking_heads=True, use_rmsnorm=True,
                               ff_mult=1.5)),
         batch=2, seq_len=7, mask_lengths=[7, 3], context_len=6, context_mask_lengths=[6, 2]),
    dict(name="dec_postnorm_relpos_memkv_scalenorm",
         about="post-norm decoder with T5 bias (16 buckets, max distance 20) and 3 memory "
               "key/values (J > I: key positions misaligned), residual attention, gated values, "
               "ScaleNorm, default dim_head 64",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=16, attn_layers=C(
             "Decoder", dim=16, depth=2, heads=2, rel_pos_bias=True, rel_pos_num_buckets=16,
             rel_pos_max_distance=20, attn_num_mem_kv=3, pre_norm=False, residual_attn=True,
             attn_gate_values=True, use_scalenorm=True, ff_mult=2)),
         batch=2, seq_len=12),
    dict(name="enc_partial_rotary_pia_macaron_qknorm",
         about="rotary_emb_dim 20 raised to 32 on dim_head 48 (partial rotary) together with "
               "position-infused attention, macaron, sandwich_norm, RMSNorm, 2 memory "
               "key/values, qk_norm with attn_scale_init_value, padded",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Encoder", dim=16, depth=1, heads=2, attn_dim_head=48, rotary_pos_emb=True,
             rotary_emb_dim=20, position_infused_attn=True, macaron=True, sandwich_norm=True,
             use_rmsnorm=True, attn_num_mem_kv=2, attn_qk_norm=True, attn_scale_init_value=-1.5,
             ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 6]),
    dict(name="encdec_text_memtok_relpos_gru",
         about="EncoderDecoder(TransformerWrapper encoder with src_mask, 2 memory tokens (not "
               "part of the context), T5 bias, talking heads; cross-attending decoder with "
               "attention-on-attention, GRU gating, untied logits); context_mask = src_mask",
         model=C("EncoderDecoder",
                 encoder=C("TransformerWrapper", num_tokens=30, max_seq_len=10,
                           num_memory_tokens=2, attn_layers=C(
                               "Encoder", dim=16, depth=1, heads=2, attn_dim_head=16,
                               rel_pos_bias=True, attn_talking_heads=True, ff_mult=2)),
                 decoder=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
                     "Decoder", dim=16, depth=1, heads=2, attn_dim_head=16, cross_attend=True,
                     attn_on_attn=True, gate_residual=True, ff_mult=2))),
         batch=2, src_len=8, src_mask_lengths=[5, 8], seq_len=7, mask_lengths=[7, 4]),
    dict(name="encdec_continuous_crossattender_rezero",
         about="EncoderDecoder(causal ContinuousTransformerWrapper encoder with src_mask, no "
               "positions (use_pos_emb false), its project_out unused, CrossAttender decoder with ReZero, head_scale and scale_"
               "residual)",
         model=C("EncoderDecoder",
                 encoder=C("ContinuousTransformerWrapper", max_seq_len=10, dim_in=5, dim_out=3,
                           use_pos_emb=False,
                           attn_layers=C("Decoder", dim=16, depth=1, heads=2, attn_dim_head=16,
                                         attn_on_attn=True, ff_glu=True, ff_mult=2)),
                 decoder=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
                     "CrossAttender", dim=16, depth=2, heads=2, attn_dim_head=16,
                     use_rezero=True, attn_head_scale=True, scale_residual=True, ff_mult=2))),
         batch=2, src_len=7, src_mask_lengths=[7, 3], seq_len=6, mask_lengths=[6, 6]),
    dict(name="vit_rezero_talking_memkv_glu",
         about="ViT classifier (8x8 image, 2x2 patches, 16 patches + cls) over an encoder with "
               "ReZero, talking heads, 1 memory key/value, GEGLU, scale_residual",
         model=C("ViTransformerWrapper", image_size=8, patch_size=2, num_classes=5, attn_layers=C(
             "Encoder", dim=16, depth=2, heads=2, attn_dim_head=16, use_rezero=True,
             attn_talking_heads=True, attn_num_mem_kv=1, ff_glu=True, scale_residual=True,
             ff_mult=2)),
         batch=2),
    dict(name="xl_rotary_memkv_resattn",
         about="Transformer-XL (max_mem_len 6, segments of 7 and 4) with rotary over memory + "
               "sequence, 2 memory key/values, residual attention, sandwich_norm",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=6,
                 attn_layers=C("Decoder", dim=16, depth=2, heads=2, attn_dim_head=32,
                               rotary_pos_emb=True, attn_num_mem_kv=2, residual_attn=True,
                               sandwich_norm=True, ff_mult=2)),
         batch=2, seq_len=7, seq_len2=4),
    dict(name="xl_pia_relpos_gru",
         about="Transformer-XL (max_mem_len 5) with position-infused attention (query offset "
               "by the memory length), T5 bias (16 buckets, misaligned over memory), GRU gating",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=5,
                 attn_layers=C("Decoder", dim=16, depth=2, heads=2, attn_dim_head=16,
                               position_infused_attn=True, rel_pos_bias=True,
                               rel_pos_num_buckets=16, rel_pos_max_distance=16,
                               gate_residual=True, ff_mult=2)),
         batch=2, seq_len=6, seq_len2=4),
    dict(name="xl_short_first_segment_tied_glu",
         about="Transformer-XL whose first segment (3) is shorter than max_mem_len (6): the "
               "returned memories keep all 3 rows (t[:, -6:]); then 3 + 5 rows are cut to 6, and "
               "a third segment of 2 reads those; rotary, tied embeddings, GEGLU, "
               "scale_residual, talking heads",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=6,
                 tie_embedding=True,
                 attn_layers=C("Decoder", dim=16, depth=1, heads=2, attn_dim_head=32,
                               rotary_pos_emb=True, ff_glu=True, scale_residual=True,
                               attn_talking_heads=True, ff_mult=2)),
         batch=2, seq_len=3, seq_len2=5, seq_len3=2),
    dict(name="enc_topk_entmax_relpos_memkv_mask",
         about="bidirectional, padded: sparse_topk 3 (after the padding mask, ties kept) feeding "
               "entmax15 (masked logits take no part), T5 bias, 2 memory key/values, talking "
               "heads before and after the entmax",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Encoder", dim=16, depth=2, heads=2, attn_dim_head=16, attn_sparse_topk=3,
             attn_use_entmax15=True, rel_pos_bias=True, rel_pos_num_buckets=8,
             rel_pos_max_distance=10, attn_num_mem_kv=2, attn_talking_heads=True, ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 5]),
    dict(name="dec_cross_entmax_topk_ctxmask_gates",
         about="a, c, f blocks: entmax15 in self- and cross-attention, sparse_topk 4 (a row "
               "with fewer than 4 visible keys keeps them all: its 4th largest is -FLT_MAX, "
               "ties kept), token mask and context_mask, residual attention, gated values, "
               "qk_norm",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=1, heads=2, attn_dim_head=16, cross_attend=True,
             attn_use_entmax15=True, attn_sparse_topk=4, residual_attn=True,
             attn_gate_values=True, attn_qk_norm=True, ff_mult=2)),
         batch=2, seq_len=7, mask_lengths=[7, 4], context_len=6, context_mask_lengths=[3, 6]),
    dict(name="xl_topk_entmax_three_segments",
         about="Transformer-XL (max_mem_len 5) over segments of 2, 4 and 3 with sparse_topk 3 "
               "(k >= J on the first segment: no-op) and entmax15, rotary over memory + "
               "sequence, macaron",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=5,
                 attn_layers=C("Decoder", dim=16, depth=1, heads=2, attn_dim_head=32,
                               attn_sparse_topk=3, attn_use_entmax15=True, rotary_pos_emb=True,
                               macaron=True, ff_mult=2)),
         batch=2, seq_len=2, seq_len2=4, seq_len3=3),
    dict(name="dec_alibi_shift_memkv_glu_mask",
         about="causal ALiBi with fixed slopes on 3 of 3 heads (not a power of two; absolute "
               "positions stay), shift_tokens 2 (shifts 0, 1, 2 over 5-feature chunks, 1 feature "
               "left), padded (masked positions zeroed before the shift in attention, not in the "
               "feed-forward), 1 memory key/value (J > I), GEGLU",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=2, heads=3, attn_dim_head=16, alibi_pos_bias=True,
             shift_tokens=2, attn_num_mem_kv=1, ff_glu=True, ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 6]),
    dict(name="enc_alibi_bidir_shift_tuple_rezero",
         about="bidirectional ALiBi (learned past and future log-slopes, equal as 0.23.0 stores "
               "them: one tensor behind both parameters; separate gradients) on 3 of 4 heads, "
               "shift_tokens per layer (1, 0, 2, 0): shifts -1..1 and -2..2 over 6- and 3-feature "
               "chunks (3 left), ReZero (keys under .fn.fn), padded, head_scale",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Encoder", dim=18, depth=2, heads=4, attn_dim_head=8, alibi_pos_bias=True,
             alibi_num_heads=3, shift_tokens=(1, 0, 2, 0), use_rezero=True, attn_head_scale=True,
             ff_mult=2)),
         batch=2, seq_len=8, mask_lengths=[8, 5]),
    dict(name="xl_alibi_learned_shift_macaron",
         about="Transformer-XL (max_mem_len 4, segments of 3, 5 and 2) with learned causal ALiBi "
               "(positions from 0 on both axes: keys over memory), shift_tokens 1 on macaron "
               "(f a f, the shifted feed-forward's keys under .fn.fn), talking heads",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=4,
                 attn_layers=C("Decoder", dim=16, depth=1, heads=2, attn_dim_head=16,
                               alibi_pos_bias=True, alibi_learned=True, shift_tokens=1,
                               macaron=True, attn_talking_heads=True, ff_mult=2)),
         batch=2, seq_len=3, seq_len2=5, seq_len3=2),
    dict(name="dec_cross_shift_ctxmask",
         about="a, c, f blocks with shift_tokens 1 (the cross-attention's queries shifted and "
               "masked too; keys and values come from the context), context_mask, sandwich_norm",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=1, heads=2, attn_dim_head=16, cross_attend=True,
             shift_tokens=1, sandwich_norm=True, ff_mult=2)),
         batch=2, seq_len=7, mask_lengths=[7, 4], context_len=5, context_mask_lengths=[5, 2]),
    dict(name="dec_window_memkv_mask",
         about="max_attend_past 3 (a sliding window: keys more than 3 positions back masked), "
               "padded, 2 memory key/values (counted as the oldest keys, so outside the window "
               "of all but the first queries), residual attention",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=2, heads=2, attn_dim_head=16, attn_max_attend_past=3,
             attn_num_mem_kv=2, residual_attn=True, ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 6]),
    dict(name="enc_cross_window_ctxmask",
         about="max_attend_past 2 on a bidirectional stack with cross-attention: the future stays "
               "visible, the window applies to the cross-attention too (queries aligned to the "
               "end of the context), context_mask",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Encoder", dim=16, depth=1, heads=2, attn_dim_head=16, cross_attend=True,
             attn_max_attend_past=2, ff_mult=2)),
         batch=2, seq_len=7, mask_lengths=[7, 5], context_len=9, context_mask_lengths=[9, 6]),
    dict(name="crossattender_causal_custom_shift",
         about="a causal CrossAttender with custom_layers (a, c, f): its self-attention is causal "
               "and shift_tokens 1 shifts only forward (a non-causal one shifts both ways), "
               "context_mask",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "CrossAttender", dim=16, depth=1, heads=2, attn_dim_head=16, causal=True,
             custom_layers=("a", "c", "f"), shift_tokens=1, ff_mult=2)),
         batch=2, seq_len=7, mask_lengths=[7, 4], context_len=5, context_mask_lengths=[5, 3]),
    dict(name="dec_collab_heads_rotary_qknorm_mask",
         about="collaborative heads (attn_collab_heads: q and k int(0.5 x 2 x 32) = 32 wide, shared by "
               "the heads, q scaled per head by collab_mixing), rotary over all 32 of them, qk_norm, "
               "padded, talking heads",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Decoder", dim=16, depth=2, heads=2, attn_dim_head=32, attn_collab_heads=True,
             attn_collab_compression=0.5, rotary_pos_emb=True, attn_qk_norm=True,
             attn_talking_heads=True, ff_mult=2)),
         batch=2, seq_len=9, mask_lengths=[9, 6]),
    dict(name="enc_cross_collab_default",
         about="collaborative heads at the default compression 0.3 (q and k int(0.3 x 3 x 16) = 14 "
               "wide, less than dim_head) on self- and cross-attention, context_mask",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=12, attn_layers=C(
             "Encoder", dim=24, depth=1, heads=3, attn_dim_head=16, cross_attend=True,
             attn_collab_heads=True, ff_mult=2)),
         batch=2, seq_len=7, mask_lengths=[7, 4], context_len=6, context_mask_lengths=[6, 3]),
    dict(name="xl_shift_mem_down",
         about="Transformer-XL (max_mem_len 4, segments of 5, 3 and 4) over 3 attention layers with "
               "shift_mem_down 1: layer l reads and extends the memories given as mems.<l+1> "
               "(the last layer mems.0)",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=4, shift_mem_down=1,
                 attn_layers=C("Decoder", dim=16, depth=3, heads=2, attn_dim_head=16, ff_mult=2)),
         batch=2, seq_len=5, seq_len2=3, seq_len3=4),
    dict(name="xl_window_rotary",
         about="Transformer-XL (max_mem_len 5, segments of 6 and 4) with max_attend_past 4: the "
               "window reaches into the memories, rotary positions",
         model=C("TransformerWrapper", num_tokens=40, max_seq_len=8, max_mem_len=5,
                 attn_layers=C("Decoder", dim=16, depth=2, heads=2, attn_dim_head=32,
                               rotary_pos_emb=True, attn_max_attend_past=4, ff_mult=2)),
         batch=2, seq_len=6, seq_len2=4),
]


def lengths_mask(lengths, n):
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def next_token_targets(tokens, mask):
    """targets[b, t] = tokens[b, t+1] where t < n-1 (and both positions are real), else -100."""
    t = torch.full_like(tokens, -100)
    t[:, :-1] = tokens[:, 1:]
    if mask is not None:
        keep = torch.zeros_like(mask)
        keep[:, :-1] = mask[:, :-1] & mask[:, 1:]
        t[~keep] = -100
    return t


def f32(t):
    return t.float().double()


def layers_of(call):
    return xt_ref.Layers(call.kwargs["attn_layers"])


def token_inputs(case, call, g, n, prefix=""):
    """tokens, mask, targets (and context, context_mask) for a TransformerWrapper."""
    b = case["batch"]
    S = layers_of(call)
    tokens = torch.randint(0, call.kwargs["num_tokens"], (b, n), generator=g)
    inp = {"tokens": tokens}
    mask = None
    if case.get("mask_lengths"):
        mask = inp["mask"] = lengths_mask(case["mask_lengths"], n)
    inp["targets"] = next_token_targets(tokens, mask)
    if S.cross_attend and "context_len" in case:
        inp["context"] = f32(torch.randn(b, case["context_len"], S.dim, generator=g))
        if case.get("context_mask_lengths"):
            inp["context_mask"] = lengths_mask(case["context_mask_lengths"], case["context_len"])
    return inp


def make_inputs(case, g):
    """The inputs of stage 1 (and for XL the token draw of stage 2)."""
    call, b = case["model"], case["batch"]
    ctor = call.ctor
    if ctor == "TransformerWrapper":
        inp = token_inputs(case, call, g, case["seq_len"])
        if call.get("max_mem_len"):
            S = layers_of(call)
            nattn = S.layer_types.count("a")
            for l in range(nattn):
                inp["mems.%d" % l] = torch.zeros(b, 0, S.dim)
            del inp["targets"]  # segment 1 only makes the memories; the loss is segment 2's
        return inp
    if ctor == "ViTransformerWrapper":
        s = call.kwargs["image_size"]
        w = f32(torch.randn(b, call.kwargs["num_classes"], generator=g))
        return {"image": f32(torch.randn(b, 3, s, s, generator=g)), "loss_weights": w}
    if ctor == "ContinuousTransformerWrapper":
        n = case["seq_len"]
        inp = {"x": f32(torch.randn(b, n, call.kwargs["dim_in"], generator=g))}
        if case.get("mask_lengths"):
            inp["mask"] = lengths_mask(case["mask_lengths"], n)
        inp["loss_weights"] = f32(torch.randn(b, n, call.kwargs["dim_out"], generator=g))
        return inp
    if ctor == "XTransformer":
        ns, nt = case["src_len"], case["tgt_len"]
        inp = {"src": torch.randint(0, call.kwargs["enc_num_tokens"], (b, ns), generator=g),
               "tgt": torch.randint(0, call.kwargs["dec_num_tokens"], (b, nt), generator=g)}
        if case.get("src_mask_lengths"):
            inp["src_mask"] = lengths_mask(case["src_mask_lengths"], ns)
        if case.get("tgt_mask_lengths"):
            inp["tgt_mask"] = lengths_mask(case["tgt_mask_lengths"], nt)
        inp["targets"] = inp["tgt"][:, 1:].clone()  # every position counts (no -100)
        return inp
    if ctor == "EncoderDecoder":
        enc = call.kwargs["encoder"]
        inp = {}
        if enc.ctor == "ViTransformerWrapper":
            s = enc.kwargs["image_size"]
            inp["image"] = f32(torch.randn(b, 3, s, s, generator=g))
        else:
            ns = case["src_len"]
            if enc.ctor == "ContinuousTransformerWrapper":
                inp["src"] = f32(torch.randn(b, ns, enc.kwargs["dim_in"], generator=g))
            else:
                inp["src"] = torch.randint(0, enc.kwargs["num_tokens"], (b, ns), generator=g)
            if case.get("src_mask_lengths"):
                inp["src_mask"] = lengths_mask(case["src_mask_lengths"], ns)
        inp.update(token_inputs(case, call.kwargs["decoder"], g, case["seq_len"]))
        return inp
    raise ValueError(ctor)


def st_tensor(t, float_dtype):
    if t.dtype == torch.bool:
        return st.Tensor("BOOL", list(t.shape), [bool(v) for v in t.reshape(-1).tolist()])
    if t.dtype in (torch.int64, torch.int32):
        return st.Tensor("I64", list(t.shape), [int(v) for v in t.reshape(-1).tolist()])
    return st.Tensor(float_dtype, list(t.shape), t.detach().reshape(-1).tolist())


def write(path, tensors, float_dtype, meta=None):
    st.write(path, {k: st_tensor(v, float_dtype) for k, v in tensors.items()}, meta)


def grad_output_input(outs, loss_inputs):
    """grad.<output> = d mean(out * w) / d out = w / numel, for models without a built-in loss."""
    (name, out), = outs.items()
    return {"grad." + name: loss_inputs / out.numel()}


def generate(case, out_dir, seed):
    name = case["name"]
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    call = case["model"]
    with open(os.path.join(d, name + ".xtf"), "w") as f:
        f.write("# %s (tests/reference/cases.py): %s\n" % (name, case["about"]))
        f.write("%s = %s\n" % (name, call.to_xtf()))

    P = xt_ref.Params(seed)
    g = torch.Generator().manual_seed(seed + 1)
    inp = make_inputs(case, g)
    stages = []
    meta = {"generator": "tests/reference/xt_ref.py", "case": name}
    if call.get("max_mem_len"):
        # segment 1: memories only
        with torch.no_grad():
            out1, _ = xt_ref.run_model(P, call, inp)
        write(os.path.join(d, "inputs.safetensors"), inp, "F32", meta)
        write(os.path.join(d, "expected.safetensors"), dict(out1), "F64", meta)
        stages = ["inputs.safetensors expected.safetensors nograds"]
        # segments 2 (and 3): fed the reference's memories of the segment before (rounded to
        # F32, as the file holds); each has its own loss and gradients
        prev = out1
        for seg, key in ((2, "seq_len2"), (3, "seq_len3")):
            if key not in case:
                break
            tok = torch.randint(0, call.kwargs["num_tokens"], (case["batch"], case[key]), generator=g)
            inp_s = {"tokens": tok, "targets": next_token_targets(tok, None)}
            for k, v in prev.items():
                if k.startswith("mems."):
                    inp_s[k] = f32(v)
            out_s, loss = xt_ref.run_model(P, call, inp_s)
            exp_s = dict(out_s)
            exp_s["loss"] = loss
            for k, v in xt_ref.gradients(P, loss).items():
                exp_s["grad." + k] = v
            write(os.path.join(d, "inputs%d.safetensors" % seg), inp_s, "F32", meta)
            write(os.path.join(d, "expected%d.safetensors" % seg), exp_s, "F64", meta)
            stages.append("inputs%d.safetensors expected%d.safetensors grads" % (seg, seg))
            prev = out_s
    else:
        outs, loss = xt_ref.run_model(P, call, inp)
        exp = dict(outs)
        if "loss_weights" in inp:  # no built-in loss: the caller's gradient comes in as an input
            inp.update(grad_output_input(outs, inp.pop("loss_weights")))
        else:
            exp["loss"] = loss
        for k, v in xt_ref.gradients(P, loss).items():
            exp["grad." + k] = v
        write(os.path.join(d, "inputs.safetensors"), inp, "F32", meta)
        write(os.path.join(d, "expected.safetensors"), exp, "F64", meta)
        stages = ["inputs.safetensors expected.safetensors grads"]
    write(os.path.join(d, "weights.safetensors"), P.values, "F32", meta)
    with open(os.path.join(d, "stages"), "w") as f:
        f.write("\n".join(stages) + "\n")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    out_dir, only = sys.argv[1], set(sys.argv[2:])
    torch.set_num_threads(1)
    names = [c["name"] for c in CASES]
    for k in only - set(names):
        sys.exit("cases.py: no case %s" % k)
    for case in CASES:
        if not only or case["name"] in only:
            generate(case, out_dir, zlib.crc32(case["name"].encode()) % 100000)
            print(case["name"])


if __name__ == "__main__":
    main()
