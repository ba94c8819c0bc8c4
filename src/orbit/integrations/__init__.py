"""Black-box upstreams (ms-swift, torchrun, model servers): called as they are, never patched;
each run keeps a thin manifest beside the upstream's own raw outputs.

May import the vocabulary, the two planes and orbit.runtime (what a launcher on the node
runs beside)."""
