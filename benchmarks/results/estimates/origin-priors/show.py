import numpy as np, sys
from lookahead.draft import ORIGINS
d = np.load(sys.argv[1]); T, A = d["tried"], d["accepted"]
print("per origin, agreement, rank (all depths, all matches): rate (tried)")
for o in range(T.shape[0]):
    if T[o].sum() < 50: continue
    for g in range(4):
        row = []
        for r in range(4):
            t, a = T[o, g, :, :, r].sum(), A[o, g, :, :, r].sum()
            row.append(f"{a/t:.2f}({int(t)})" if t else "-")
        print(f"{ORIGINS[o]:8s} agree{g}", " ".join(row))
print("all origins, by agreement and depth (rank 0 / rank>=1)")
for g in range(4):
    for r0 in (0, 1):
        rs = slice(0,1) if r0 == 0 else slice(1,4)
        row=[]
        for dd in [0,1,2,3,5,7,11]:
            t, a = T[:, g, :, dd:dd+2 if dd>=3 else dd+1, rs].sum(), A[:, g, :, dd:dd+2 if dd>=3 else dd+1, rs].sum()
            row.append(f"d{dd+1}:{a/t:.2f}({int(t)})" if t else f"d{dd+1}:-")
        print(f"agree{g} rank{'0' if r0==0 else '1+'}", " ".join(row))
print("by agreement and match bucket (all origins, ranks, depths)")
for g in range(4):
    print(f"agree{g}", " ".join(f"m{m+1}:{A[:,g,m].sum()/max(T[:,g,m].sum(),1):.2f}({int(T[:,g,m].sum())})" for m in range(3)))
