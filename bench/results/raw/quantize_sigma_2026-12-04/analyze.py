# Proxy error of each pack's W_spillway under each Hessian (held-out H = the truth for the eval text).
import glob, os, sys
import numpy as np
from safetensors.numpy import load_file
packs = [p for p in sys.argv[1].split(",") if os.path.isdir(f"/tmp/q6/{p}")]
stems = sorted(os.path.basename(f) for f in glob.glob(f"/tmp/q6/{packs[0]}/*.safetensors"))
hs = sys.argv[2].split(",")
def err(W, Q, H): D = Q - W; return np.trace(D.T @ H @ D) / np.trace(W.T @ H @ W)
rows = []
for s in stems:
    d = {p: load_file(f"/tmp/q6/{p}/{s}") for p in packs if os.path.exists(f"/tmp/q6/{p}/{s}")}
    W = d[packs[0]]["W"].astype(np.float64)
    for p in d: assert np.array_equal(d[p]["W"], d[packs[0]]["W"])
    H = {h: d[h]["H"].astype(np.float64) for h in hs if h in d}
    H["I"] = np.eye(W.shape[0])
    r = {(p, h): err(W, d[p]["W_spillway"].astype(np.float64), H[h]) for p in d for h in H}
    rows.append((s, r))
print("mean proxy error of pack P (rows) under Hessian H (cols); tensors:", len(rows))
Hn = sorted({h for _, r in rows for (_, h) in r})
print("pack\t" + "\t".join(Hn))
for p in packs:
    print(p + "\t" + "\t".join(f"{np.mean([r[(p, h)] for _, r in rows if (p, h) in r]):.5f}" for h in Hn))
for w in ("w1", "w2", "w3"):
    sel = [r for s, r in rows if s.endswith(w + ".safetensors")]
    print(w, " ".join(f"{p}|ho={np.mean([r[(p,'ho')] for r in sel]):.5f}" for p in packs if all((p,'ho') in r for r in sel)))
