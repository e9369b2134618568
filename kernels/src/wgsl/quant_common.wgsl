// Packed quantized weights, shared by the quantization kernels. A row's
// codes form one bit stream, lowest bits first: code j of a row occupies
// bits j·BITS .. (j+1)·BITS, bit b being bit b % 32 of word b / 32, so a
// 3-, 5- or 6-bit code may straddle two words. The generated part above
// defines BITS, MASK, the packed binding `in_1` (where read), `decode(code,
// scale, bias)` and the dtype's loads.

// QLoRA's NF4 levels (a private array: indexed at run time).
var<private> NF4: array<f32, 16> = array<f32, 16>(
    -1.0, -0.6961928, -0.52507305, -0.3949175,
    -0.28444138, -0.18477343, -0.091050036, 0.0,
    0.0795803, 0.1609302, 0.2461123, 0.33791524,
    0.44070983, 0.562617, 0.72295684, 1.0,
);
