# Rebuild the step 18 kernel variants (issue 6) under .gpu/s18/ from the patches beside this script: each is
# profiler_kit/attention/flash_gluon_bwd.py as of commit c8bd9ab (read from git) with one change. The "_r168"
# copies cap the registers at 168 per thread, so that three 4-warp blocks fit on an SM. Run from the repository
# root of a git checkout.
set -euo pipefail
mkdir -p .gpu/s18
for patch in scripts/step18/*.patch; do
  name=$(basename "$patch" .patch)
  git show c8bd9ab:profiler_kit/attention/flash_gluon_bwd.py > ".gpu/s18/$name.py"
  patch --quiet ".gpu/s18/$name.py" < "$patch"
done
for name in fused_lean fused_lean2a fused_lean2b; do
  sed "s/^_CAP = {}$/_CAP = {'maxnreg': 168}/" ".gpu/s18/$name.py" > ".gpu/s18/${name}_r168.py"
  grep -q "^_CAP = {'maxnreg': 168}$" ".gpu/s18/${name}_r168.py"
done
