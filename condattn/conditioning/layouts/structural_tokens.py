"""CET's token site found by structure, on a model no token layout names (priority -100, after every named one).

X is the tensor that enters the first transformer block. The blocks are the children of the innermost nn.ModuleList
or nn.Sequential whose children hold every attention layer of the model (the attention sites, found as SCA finds
them); the first block is the first of those children that holds one. Where no one container holds them all (an
encoder and a decoder, two towers), which stack's input is X is ambiguous: refused, with the one line that names it
(sites.token_snippet). Found by structure, the site knows no token embedding before positions and no prefix tokens:
CET's position=before_pos_embed and tokens=patches_only are refused on it, with why; and no padding mask (every row
enters the SVD, and the report entry says so). A causal decoder that says so only in its kernel call
(`is_causal=True` in F.scaled_dot_product_attention) is read from a traced call of its first attention layer.

Only the model itself (the outermost module) is matched; not a timm model or one built of timm's attention modules
(their inputs and prefix tokens are a layout's to say), not attention over channels-first maps (1×1 convolutions),
nor a model whose attention is transformers' (its padding mask is passed as attention_mask, which only a named token
layout reads): those refuse, with why.
"""

from __future__ import annotations

from torch import nn

from ..sites import TOKENS_WHY, TokenSite, find_attention, join, layer_of, of_library, token_layout


def _inside(site: str, child: str) -> bool:
    return site == child or site.startswith(child + ".")


def blocks_of(model: nn.Module, sites: list[str]) -> tuple[str, list[tuple[str, nn.Module]]] | str:
    """(the container's name, its children that hold an attention site, in order) or why none can be chosen."""
    best = None
    for cname, c in model.named_modules():
        if not isinstance(c, (nn.ModuleList, nn.Sequential)):
            continue
        children = [(join(cname, k), v) for k, v in c.named_children()]
        holding = [(n, v) for n, v in children if any(_inside(s, n) for s in sites)]
        if holding and all(any(_inside(s, n) for n, _ in holding) for s in sites):
            if best is None or len(cname) > len(best[0]) or not best[0]:
                best = (cname, holding)
    if best is None:
        stacks = sorted({s.rpartition(".")[0].rpartition(".")[0] or s for s in sites})
        return (f"its {len(sites)} attention layers are not the children of one nn.ModuleList or nn.Sequential "
                f"(they lie under {', '.join(stacks[:3])}): which stack's input is X is ambiguous")
    return best


@token_layout("structural_tokens", priority=-100)
def structural_tokens(name: str, m: nn.Module) -> TokenSite | None:
    """The model's first-block input, found by structure (module docstring)."""
    if name or not any(True for _ in m.children()):
        return None
    if of_library(m, "timm"):  # (a timm model without a token layout: its prefix tokens are the layout's to say)
        TOKENS_WHY[type(m)] = f"no token layout of timm's {type(m).__name__} is registered"
        return None
    sites = find_attention(m)
    if not sites:
        TOKENS_WHY[type(m)] = "no attention layer was found in it"
        return None
    if of_library(sites[0].module, "timm"):  # (maps or tokens, class tokens: timm's modules' conventions vary)
        TOKENS_WHY[type(m)] = (f"its attention layers are timm's {type(sites[0].module).__name__}, whose inputs (token "
                               "sequences or channels-first maps) and prefix tokens only a named token layout knows")
        return None
    if isinstance(sites[0].proj["q" if "q" in sites[0].proj else "k"].linear, nn.modules.conv._ConvNd):
        TOKENS_WHY[type(m)] = ("its attention projects channels-first maps with 1×1 convolutions: which axis holds "
                               "the tokens is a named token layout's to say")
        return None
    if of_library(sites[0].module, "transformers"):  # (its padding mask is passed as attention_mask, its way)
        TOKENS_WHY[type(m)] = (f"its attention layers are transformers' {type(sites[0].module).__name__}, and no "
                               "token layout of that model is registered: one found by structure would not read its "
                               "padding mask")
        return None
    found = blocks_of(m, [layer_of(s.name) for s in sites])
    if isinstance(found, str):
        TOKENS_WHY[type(m)] = found
        return None
    cname, blocks = found
    first_name, first = blocks[0]
    attn = sites[0].module
    seq_first = isinstance(attn, nn.MultiheadAttention) and not attn.batch_first
    from ..traced import traced_causal  # (imports verify.py, which registers into the sites this module reads)

    causal = traced_causal(sites[0])
    how = (f"found by structure: the input of {first_name}, the first of {len(blocks)} blocks of "
           f"{cname or type(m).__name__} holding its attention layers; no padding mask known (every row enters the "
           "SVD)")
    return TokenSite("structural_tokens", first, first_name, None, "", 0, blocks, sequence_first=seq_first,
                     causal=causal, found=how,
                     unknown={"position": "found by structure, its token embedding before positions is not known "
                                          "(a token_layout naming `embed` reads it)",
                              "tokens": "found by structure, its prefix (class) tokens are not known (a token_layout "
                                        "naming num_prefix_tokens reads them)"})
