"""The progressive family: the progressive transform ladder (`ladder`: the `progressive` codec and
`layered:quantiser="ecsq"`'s coder), its inverse DCT (`fastdct`, with the generated straight-line
kernels `_lee`) and the build's table-fit kernels (`fitkernels`). Imports only the shared base."""
