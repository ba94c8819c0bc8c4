"""Black-box upstreams (ms-swift, torchrun, model servers): called as they are, never patched;
each run keeps a thin manifest beside the upstream's own raw outputs.

May import the vocabulary and the two planes."""
