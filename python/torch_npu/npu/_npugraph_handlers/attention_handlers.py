"""The built-in NPU graph update handlers: fused infer attention (v1, v2), paged attention, MLA."""
import torch

from .npugraph_handler import NpuGraphOpHandler, register_npu_graph_handler


class _InferAttentionHandler(NpuGraphOpHandler):
    r"""npu_fused_infer_attention_score(_v2): the functional overload is captured as its
    ``.out`` overload into outputs allocated before the group (an update writes them again);
    the caller gets ``[attention_out, softmax_lse]``."""

    PACKET = None          # the operator's OpOverloadPacket
    INFER_OUTPUT = None    # the operator giving its outputs from the query and value
    INFER_OUTPUT_KWARGS = ()

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        out = cls.PACKET().out
        if func is out:
            return func, args, kwargs
        query, value = args[0], args[2]
        infer_kwargs = {k: kwargs[k] for k in cls.INFER_OUTPUT_KWARGS if k in kwargs}
        attention_out, softmax_lse = cls.INFER_OUTPUT()(query, value, **infer_kwargs)
        return out, args, dict(kwargs, attention_out=attention_out, softmax_lse=softmax_lse)

    @classmethod
    def postprocess_result(cls, result, kwargs):
        return [kwargs["attention_out"], kwargs["softmax_lse"]]


def _specs(names, specs):
    return {name: list(specs) for name in names}


_IFA_V1 = ["npu_fused_infer_attention_score", "npu_fused_infer_attention_score.default",
           "npu_fused_infer_attention_score.out"]
_IFA_V2 = ["npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2.default",
           "npu_fused_infer_attention_score_v2.out"]


@register_npu_graph_handler(_IFA_V1)
class _IFAv1Handler(_InferAttentionHandler):
    UPDATE_SPECS = _specs(_IFA_V1, [("arg", 5, "actual_seq_lengths"), ("arg", 6, "actual_seq_lengths_kv")])
    PACKET = staticmethod(lambda: torch.ops.npu.npu_fused_infer_attention_score)
    INFER_OUTPUT = staticmethod(lambda: torch.ops.npu._npu_fused_infer_attention_score_infer_output)
    INFER_OUTPUT_KWARGS = ("input_layout", "quant_scale2", "block_table", "num_heads", "num_key_value_heads",
                           "softmax_lse_flag", "query_rope")


@register_npu_graph_handler(_IFA_V2)
class _IFAv2Handler(_InferAttentionHandler):
    UPDATE_SPECS = _specs(_IFA_V2, [("arg", 7, "actual_seq_qlen"), ("arg", 8, "actual_seq_kvlen")])
    PACKET = staticmethod(lambda: torch.ops.npu.npu_fused_infer_attention_score_v2)
    INFER_OUTPUT = staticmethod(lambda: torch.ops.npu._npu_fused_infer_attention_score_v2_infer_output)
    INFER_OUTPUT_KWARGS = ("query_dtype", "value_dtype", "input_layout", "quant_scale_out", "block_table",
                           "num_query_heads", "num_key_value_heads", "return_softmax_lse", "query_rope", "out_dtype")


@register_npu_graph_handler(["_npu_paged_attention.default", "npu_multi_head_latent_attention.out"])
class _ContextLensHandler(NpuGraphOpHandler):
    r"""Paged attention and MLA write a given output; an update gives new ``context_lens``."""
    UPDATE_SPECS = {
        "_npu_paged_attention.default": [("arg", 7, "context_lens")],
        "npu_multi_head_latent_attention.out": [("arg", 5, "context_lens")],
    }
