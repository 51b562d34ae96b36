"""Operators without a converter that ONNX defines as a *function* of other operators (Swish,
RMSNormalization, Attention, the losses, ...), and a model's own local functions, are expanded
into their body's nodes, which are converted one by one (what ONNX's ``_expanded`` node tests do).
"""

from __future__ import annotations

import itertools

_COUNT = itertools.count()


def body(node, opset: int, input_types: list, local: dict) -> tuple[list, int] | None:
    """The nodes ``node`` stands for and the default-domain opset they are written in, or ``None``
    when it is neither a function of the ONNX schema (at ``opset``) nor a local function.
    ``input_types``: a ``TypeProto`` per input (context-dependent functions read them)."""
    from onnx import FunctionProto, defs

    fn = local.get((node.domain, node.op_type))
    attrs = {a.name: a for a in node.attribute}
    if fn is None:
        try:
            schema = defs.get_schema(node.op_type, opset, node.domain)
        except defs.SchemaError:
            return None
        for name, spec in schema.attributes.items():
            if name not in attrs and spec.default_value and spec.default_value.name:
                attrs[name] = spec.default_value
        versions = [v for v in schema.function_opset_versions if v <= opset]
        fn = FunctionProto()
        if versions:
            fn.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        else:
            versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
            if not versions:
                return None
            fn.ParseFromString(schema.get_context_dependent_function_with_opset_version(
                max(versions), node.SerializeToString(), [t.SerializeToString() for t in input_types]))
    inner = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), opset)
    return _renamed(node, fn, attrs), inner


def _renamed(node, fn, attrs: dict) -> list:
    prefix = f"{node.op_type}{next(_COUNT)}__"
    names = {formal: node.input[k] if k < len(node.input) else "" for k, formal in enumerate(fn.input)}
    names.update({formal: node.output[k] for k, formal in enumerate(fn.output)
                  if k < len(node.output) and node.output[k]})

    def rename(n: str) -> str:
        return names.get(n, prefix + n if n else "")

    return [_node(inner, rename, attrs) for inner in fn.node]


def _node(inner, rename, attrs: dict):
    """``inner`` with every value name renamed (in its subgraphs too) and attribute references
    resolved from ``attrs``."""
    from onnx import AttributeProto, NodeProto

    new = NodeProto()
    new.CopyFrom(inner)
    del new.input[:]
    del new.output[:]
    del new.attribute[:]
    new.input.extend(rename(n) for n in inner.input)
    new.output.extend(rename(n) for n in inner.output)
    for a in inner.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name in attrs:
                copy = AttributeProto()
                copy.CopyFrom(attrs[a.ref_attr_name])
                copy.name = a.name
                new.attribute.append(copy)
            continue
        copy = AttributeProto()
        copy.CopyFrom(a)
        if a.type == AttributeProto.GRAPH:
            g = copy.g
            nodes = [_node(n, rename, attrs) for n in g.node]
            del g.node[:]
            g.node.extend(nodes)
            for v in [*g.input, *g.output, *g.initializer]:
                v.name = rename(v.name)
        new.attribute.append(copy)
    return new

