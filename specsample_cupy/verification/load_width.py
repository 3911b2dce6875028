"""How the kernels read a row: the dtype's tag in the CUDA templates, and the elements per 16-byte load."""

DTYPE_TAG = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}


def vec_width(dtype_name, V, *arrays):
    """(kernel dtype tag, elements per 16-byte load) for rows of V entries of this dtype: scalar loads
    where V or an array's address is not 16-byte aligned."""
    tag = DTYPE_TAG[dtype_name]
    vec = 16 // ITEMSIZE[tag]
    if V % vec or any(a.data.ptr % 16 for a in arrays if a is not None and a.size):
        vec = 1  # rows not 16-byte aligned: scalar loads
    return tag, vec
