"""The CPU attention kernel: a small C++/OpenMP operator (csrc/) built with torch's extension tools at install
time (build.py), its Python wrapper (paged_decode.py) and its attention backend."""
