"""One module per architecture family; importing this package registers every layout (conditioning/sites.py).

| module          | attention layouts                          | token layout  |
|-----------------|--------------------------------------------|---------------|
| timm_vit        | timm_fused_qkv                             | timm_vit      |
| swin            | timm_swin_window                           | timm_swin     |
| xcit            | timm_xca, timm_class_attn                  | timm_xcit     |
| davit           | timm_davit_window, timm_davit_channel      | timm_davit    |
| hf_encoder      | hf_separate_qkv (BERT, Nyströmformer)      | hf_encoder    |
| gpt2            | hf_gpt2                                    | hf_gpt2       |
| detr            | hf_detr                                    | hf_detr       |
| crammed_bert    | crammed_bert (condattn.models.crammed_bert) | crammed_bert  |
| timm_eva        | timm_eva (EVA-02, RoPE ViT: EvaAttention, AttentionRope) | timm_eva |
| timm_beit       | timm_beit (BEiT)                           | timm_beit     |
| hf_vit          | hf_vit (transformers ViTModel)             | hf_vit        |
| hf_llama        | hf_llama (Llama, Mistral, Qwen2)           | hf_llama      |
| torch_mha       | torch_mha (nn.MultiheadAttention)          | (none: SCA only) |
| timm_conv       | timm_maxxvit_conv, timm_halo, timm_bottleneck, timm_pwise_conv, timm_csatv2_spatial | (none) |
| timm_bn         | timm_levit, timm_efficientformer_v2 (λI added to W before its BatchNorm) | (none) |
| timm_efficientvit_msra | timm_efficientvit_msra (a site per cascaded head, `layer#h<h>`; λI before BN) | (none) |
| timm_gcvit      | timm_gcvit (GCViT; its global attention has no W_Q: λI on W_K, W_V only) | (none) |
| refused         | (none: sites.REFUSED, why attention without q·kᵀ or one W per role is refused) | (none) |
| structural      | structural (any q/k/v or fused-qkv Linears / 1×1 convs with a head count; priority -100) | (none) |

timm and transformers are imported inside the finders, and only after `sites.of_library(m, "timm")` (or
"transformers") found the module's class, or one of its bases, defined in that package: a model of one library never
imports the other, and a home-made model neither, so the library needs torch alone (tests/test_torch_alone.py).

Expected PatchReport counts follow from each architecture's definition (asserted in tests/test_layouts.py and the
model zoo's tests): ViT / DeiT: `depth` timm_fused_qkv; Swin: sum(depths) timm_swin_window; XCiT: `depth` timm_xca
+ `cls_attn_layers` timm_class_attn; DaViT: sum(depths) timm_davit_window + sum(depths) timm_davit_channel; BERT /
Nyströmformer: num_hidden_layers hf_separate_qkv; GPT-2: n_layer hf_gpt2 (2 × n_layer with cross-attention);
crammed BERT: num_layers crammed_bert; DETR: E + 2·D hf_detr (encoder self, decoder self, decoder cross); Eva /
BEiT: `depth` timm_eva / timm_beit; HF ViT and Llama-style decoders: num_hidden_layers hf_vit / hf_llama;
nn.MultiheadAttention: one torch_mha each; timm 1×1-conv attention: one timm_conv site per attention module
(timm_conv.py's docstring); LeViT / EfficientFormer-V2: one timm_bn site per attention module (timm_bn.py's);
GCViT: sum(depths) timm_gcvit (timm_gcvit.py's).

A user's own model needs no edit here: `condattn.conditioning.attention_layout` / `token_layout` register a finder
from user code (docs/getting-started.md, "Register a layout for your own model").
"""

from . import (
                                                        crammed_bert,
                                                        davit,
                                                        detr,
                                                        gpt2,
                                                        hf_encoder,
                                                        hf_llama,
                                                        hf_vit,
                                                        refused,
                                                        structural,
                                                        structural_tokens,
                                                        swin,
                                                        timm_beit,
                                                        timm_bn,
                                                        timm_conv,
                                                        timm_efficientvit_msra,
                                                        timm_eva,
                                                        timm_gcvit,
                                                        timm_vit,
                                                        torch_mha,
                                                        xcit,
)

FAMILIES = {m.__name__.rpartition(".")[2]: m for m in (timm_vit, swin, xcit, davit, hf_encoder, gpt2, detr,
                                                        crammed_bert, timm_eva, timm_beit, hf_vit, hf_llama,
                                                        torch_mha, timm_conv, timm_bn, timm_efficientvit_msra,
                                                        timm_gcvit, refused, structural, structural_tokens)}

__all__ = ["FAMILIES"]
