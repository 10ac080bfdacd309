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

timm and transformers are imported inside the finders, after a cheap attribute test where one exists, so a model
of one library never imports the other and both stay optional.

Expected PatchReport counts follow from each architecture's definition (asserted in tests/test_layouts.py and the
model zoo's tests): ViT / DeiT: `depth` timm_fused_qkv; Swin: sum(depths) timm_swin_window; XCiT: `depth` timm_xca
+ `cls_attn_layers` timm_class_attn; DaViT: sum(depths) timm_davit_window + sum(depths) timm_davit_channel; BERT /
Nyströmformer: num_hidden_layers hf_separate_qkv; GPT-2: n_layer hf_gpt2 (2 × n_layer with cross-attention);
crammed BERT: num_layers crammed_bert; DETR: E + 2·D hf_detr (encoder self, decoder self, decoder cross).
"""

from . import crammed_bert, davit, detr, gpt2, hf_encoder, swin, timm_vit, xcit

FAMILIES = {m.__name__.rpartition(".")[2]: m for m in (timm_vit, swin, xcit, davit, hf_encoder, gpt2, detr,
                                                        crammed_bert)}

__all__ = ["FAMILIES"]
