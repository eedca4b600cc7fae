// torch.<name> of a dtype, for error messages, on every torch the matrix pins (c10::getDtypeNames
// is not in torch 2.4, which the cuda12.1 entry uses).
#pragma once

#include <c10/core/ScalarType.h>

namespace myops {

inline const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default: return c10::toString(t);
  }
}

}  // namespace myops
