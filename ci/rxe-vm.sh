#!/usr/bin/env bash
# rxe-vm.sh - run a host-built program against a real libibverbs device without RDMA
# hardware: a throw-away qemu VM boots Debian bookworm's own kernel, loads Soft-RoCE
# (rdma_rxe), creates rxe0 and runs the program there.
#
#   ci/rxe-vm.sh build                  fetch the packages and build vmlinuz + initrd.gz
#                                       (cached; rebuilt when the kernel package or this
#                                       script's package/module lists change)
#   ci/rxe-vm.sh run DIR CMD [ARGS..]   boot, share host DIR read-write at /mnt/host (9p),
#                                       run CMD there as root and exit with its status
#                                       (99: the VM died or timed out without a status)
#   ci/rxe-vm.sh selftest               boot, show the device, run ibv_rc_pingpong on rxe0
#
# The guest: rxe0 on a dummy netdev (rxenet0, 10.77.0.1/24, ARP on), rdma_ucm loaded
# for librdmacm, GID index 1 is the
# IPv4-mapped ::ffff:10.77.0.1 (index 0 is the MAC-derived fe80:: one). Only one rxe
# device: two QPs on rxe0 talk through rxe's loopback. The guest has no NIC.
# Userspace: busybox, libibverbs + the rxe provider, librdmacm, ibverbs-utils, perftest,
# iproute2.
# Host binaries must be built for bookworm's glibc (true when built on bookworm).
#
# Host needs: Debian bookworm, root (apt-get), the Debian mirror. The script installs
# qemu-system-x86, kmod and cpio itself when they are missing.
#
# Environment:
#   RXEVM_DIR      cache and scratch directory (default /tmp/rxevm)
#   RXEVM_SMP      vCPUs (default 4: fewer makes rxe's deferred work wait for the 4 ms
#                  scheduler tick whenever the program busy-polls)
#   RXEVM_MEM      guest memory (default 1G)
#   RXEVM_ACCEL    kvm|tcg; default kvm only if /dev/kvm is read-write AND the CPU
#                  advertises vmx/svm (a nested PVM "kvm" without them hangs a stock kernel)
#   RXEVM_TIMEOUT  seconds before the VM is killed (default 600)
#   RXEVM_BOOT_TIMEOUT  seconds the guest's init has to say it is up (default 180); a
#                  VM that has not by then is killed and booted once more (the kernel is
#                  quiet: without the init's word a boot that hangs and a workload that
#                  hangs look alike on the console, and a hung boot would cost the whole
#                  RXEVM_TIMEOUT)
#   RXEVM_APPEND   extra kernel command-line words
#   RXEVM_EXTRA_DEBS  more guest packages (part of the image's key: give such an image a
#                  RXEVM_DIR of its own, or the default one is rebuilt back and forth)
#   RXEVM_EXTRA_MODS  more kernel modules, loaded at boot after the others (part of the
#                  image's key, as RXEVM_EXTRA_DEBS)
#
# The guest's clock source is the TSC (clocksource=tsc tsc=reliable): under TCG the
# kernel would otherwise pick the HPET, which makes every clock_gettime a system call
# that reads an emulated device (microseconds each), and makes perftest's sampling of
# the CPU frequency fail or come out wrong (its latencies then read up to twice too
# small, or inf).
set -euo pipefail

CACHE=${RXEVM_DIR:-/tmp/rxevm}
IMG=$CACHE/image
SMP=${RXEVM_SMP:-4}
MEM=${RXEVM_MEM:-1G}
TIMEOUT=${RXEVM_TIMEOUT:-600}
BOOT_TIMEOUT=${RXEVM_BOOT_TIMEOUT:-180}

# Guest userspace, straight from the bookworm mirror (nothing is taken from the host).
GUEST_DEBS="busybox-static libc6 libgcc-s1 zlib1g libmd0 libbsd0 libcap2 libelf1 libbpf1
  libmnl0 libnl-3-200 libnl-route-3-200 libibverbs1 ibverbs-providers librdmacm1
  ibverbs-utils iproute2 perftest libpci3 libudev1 libibumad3 ${RXEVM_EXTRA_DEBS:-}"
# Kernel modules to load (their dependencies are added in load order). crc32_generic is
# not a declared dependency of rdma_rxe, but rxe asks the crypto API for "crc32".
# rdma_ucm serves /dev/infiniband/rdma_cm to librdmacm (rdma_cm itself comes with it).
GUEST_MODS="crc32_generic crc32-pclmul rdma_rxe rdma_ucm dummy virtio_pci 9pnet_virtio 9p ${RXEVM_EXTRA_MODS:-}"

say() { printf '[rxe-vm] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

ensure_host_tools() {
    local missing=() t
    for t in qemu-system-x86_64:qemu-system-x86 depmod:kmod modprobe:kmod cpio:cpio \
        dpkg-deb:dpkg gzip:gzip; do
        command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing host tools: ${missing[*]}"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
}

kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1
}

image_key() {
    # what the cached image depends on: the kernel ABI and the lists above
    printf '%s|%s|%s|%s\n' "$1" "$(echo $GUEST_DEBS)" "$(echo $GUEST_MODS)" \
        "$(sed -n '/^guest_init() {/,/^}/p' "$0" | md5sum | cut -c1-12)"
}

build_image() {
    ensure_host_tools
    local kpkg kver key
    kpkg=$(kernel_package)
    [ -n "$kpkg" ] || { apt-get update -q >/dev/null; kpkg=$(kernel_package); }
    [ -n "$kpkg" ] || die "cannot resolve the kernel package behind linux-image-amd64"
    kver=${kpkg#linux-image-}
    key=$(image_key "$kpkg")
    if [ -f "$IMG/key" ] && [ "$(cat "$IMG/key")" = "$key" ] && [ -s "$IMG/initrd.gz" ] &&
        [ -s "$IMG/vmlinuz" ]; then
        say "image is current ($kpkg) in $IMG"
        return 0
    fi
    local t0=$SECONDS debs=$CACHE/debs kroot=$CACHE/kernel root=$CACHE/rootfs
    rm -rf "$debs" "$kroot" "$root" "$IMG"
    mkdir -p "$debs" "$kroot" "$root" "$IMG"
    # apt-get download drops privileges to _apt where it can; let it write here
    chmod 0777 "$debs"
    say "downloading $kpkg and the guest packages"
    (cd "$debs" && apt-get download -q $kpkg $GUEST_DEBS >/dev/null 2>&1) ||
        { apt-get update -q >/dev/null; (cd "$debs" && apt-get download -q $kpkg $GUEST_DEBS >/dev/null); }

    say "unpacking the kernel"
    dpkg-deb -x "$debs/$kpkg"_*.deb "$kroot"
    cp "$kroot/boot/vmlinuz-$kver" "$IMG/vmlinuz"
    depmod -b "$kroot" "$kver"    # the .deb leaves modules.dep to its postinst

    say "unpacking the guest userspace"
    local deb
    for deb in "$debs"/*.deb; do
        case ${deb##*/} in linux-image-*) continue ;; esac
        dpkg-deb -x "$deb" "$root"
    done
    # keep it small: no docs, locales, udev rules, init scripts, or other providers
    rm -rf "$root/usr/share" "$root/etc/init.d" "$root/lib/udev" "$root/usr/lib/udev" \
        "$root/usr/lib/x86_64-linux-gnu/gconv"
    find "$root/etc/libibverbs.d" -type f ! -name 'rxe.driver' -delete
    find "$root/usr/lib/x86_64-linux-gnu/libibverbs" -type f ! -name 'librxe-*' -delete

    local d a
    for d in bin sbin usr/bin usr/sbin proc sys dev tmp run root etc mnt/host; do mkdir -p "$root/$d"; done
    # busybox applets, unless a real binary of that name exists (iproute2's ip)
    for a in $("$root/bin/busybox" --list-full); do
        local base=${a##*/} have=""
        for d in bin sbin usr/bin usr/sbin; do [ -e "$root/$d/$base" ] && have=1; done
        [ -n "$have" ] || ln -s /bin/busybox "$root/$a"
    done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
    echo 'root:x:0:' >"$root/etc/group"
    printf '127.0.0.1 localhost\n10.77.0.1 rxevm\n' >"$root/etc/hosts"

    say "selecting kernel modules"
    local kmods=$kroot/lib/modules/$kver gmods=$root/lib/modules/$kver m p rel
    mkdir -p "$gmods"
    : >"$root/etc/rxevm-modules"
    for m in $GUEST_MODS; do
        modprobe -d "$kroot" -S "$kver" --show-depends "$m" ||
            die "module $m is not in $kpkg"
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r p; do
        rel=${p#"$kmods"/}
        mkdir -p "$gmods/${rel%/*}"
        cp "$p" "$gmods/$rel"
        echo "/lib/modules/$kver/$rel" >>"$root/etc/rxevm-modules"
    done
    cp "$kmods"/modules.order "$kmods"/modules.builtin* "$gmods/"
    depmod -b "$root" "$kver"    # so that the kernel's own request_module works in the guest

    guest_init >"$root/init"
    chmod 0755 "$root/init"

    # every guest binary and library must resolve from the guest root alone
    local libs="$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu" f bad=""
    while IFS= read -r f; do
        file_is_elf "$f" || continue
        if LD_LIBRARY_PATH=$libs ldd "$f" 2>/dev/null | grep -q 'not found'; then
            bad="$bad $f:$(LD_LIBRARY_PATH=$libs ldd "$f" | awk '/not found/ {printf " %s", $1}')"
        fi
    done < <(find "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" \
        "$root/usr/lib/x86_64-linux-gnu/libibverbs" -type f)
    [ -z "$bad" ] || die "unresolved libraries in the guest:$bad"

    say "packing the initramfs"
    (cd "$root" && find . -print | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1) \
        >"$IMG/initrd.gz"
    echo "$key" >"$IMG/key"
    say "image built in $((SECONDS - t0)) s: vmlinuz $(du -h "$IMG/vmlinuz" | cut -f1)," \
        "initrd.gz $(du -h "$IMG/initrd.gz" | cut -f1)"
}

file_is_elf() { [ "$(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }

# PID 1 of the guest (busybox ash: keep it POSIX)
guest_init() {
    cat <<'INIT'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc none /proc
echo "@@RXEVM-UP@@"
mount -t sysfs none /sys
mount -t devtmpfs none /dev
mount -t tmpfs none /tmp
mount -t tmpfs none /run
ln -s /proc/self/fd /dev/fd 2>/dev/null
echo /sbin/modprobe >/proc/sys/kernel/modprobe

done_with() {
    echo "@@RXEVM-STATUS=$1@@"
    sync
    poweroff -f
}

mode=selftest
for w in $(cat /proc/cmdline); do
    case $w in rxevm=*) mode=${w#rxevm=} ;; esac
done

for m in $(cat /etc/rxevm-modules); do
    n=$(basename "$m" .ko | tr - _)
    grep -q "^$n " /proc/modules || insmod "$m" || echo "rxe-vm: insmod $m failed"
done
dmesg -n 1    # rxe logs "speed is unknown" on every port query

ip link set lo up
ip link add rxenet0 type dummy
# ARP on, so that an address of the subnet nobody has stays unresolved (rdma_cm's
# address query then ends at its timeout) rather than resolving at once as on a NOARP
# device; the dummy drops the requests.
ip link set rxenet0 arp on
ip addr add 10.77.0.1/24 dev rxenet0
ip link set rxenet0 up
rdma link add rxe0 type rxe netdev rxenet0 || done_with 90

if [ "$mode" = run ]; then
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host /mnt/host || done_with 91
    cd /mnt/host || done_with 91
    sh /mnt/host/.rxevm-cmd
    done_with $?
fi

rc=0
rdma link show
ibv_devinfo -d rxe0 || rc=1
ibv_rc_pingpong -d rxe0 -g 1 -n 200 >/tmp/server.log 2>&1 &
sleep 1
ibv_rc_pingpong -d rxe0 -g 1 -n 200 127.0.0.1 || rc=1
wait
cat /tmp/server.log
done_with $rc
INIT
}

run_vm() { # run_vm LOG QEMU..: runs the VM, its console shown and kept in LOG; fails
    # (having killed it) if the guest's init did not say it is up within BOOT_TIMEOUT
    local log=$1 pid tailpid waited=0 up=0
    shift
    : >"$log"
    timeout "$TIMEOUT" "$@" </dev/null >"$log" 2>&1 &
    pid=$!
    tail -f --pid="$pid" "$log" &
    tailpid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$up" = 0 ] && grep -aq '@@RXEVM-UP@@' "$log"; then
            up=1
        fi
        if [ "$up" = 0 ] && [ "$waited" -ge "$BOOT_TIMEOUT" ]; then
            kill "$pid" 2>/dev/null || true
            break
        fi
        sleep 1
        waited=$((waited + 1))
    done
    wait "$pid" 2>/dev/null || true
    wait "$tailpid" 2>/dev/null || true
    grep -aq '@@RXEVM-UP@@' "$log"
}

boot() { # boot MODE [SHARED_DIR]
    local mode=$1 share=${2:-} accel=${RXEVM_ACCEL:-} cpu
    if [ -z "$accel" ]; then
        if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
            accel=kvm
        else
            accel=tcg
        fi
    fi
    case $accel in
    kvm) cpu=host ;;
    tcg) cpu=max; accel=tcg,thread=multi ;;
    *) die "RXEVM_ACCEL must be kvm or tcg" ;;
    esac
    local qemu=(qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp "$SMP" -m "$MEM"
        -nodefaults -no-user-config -nographic -monitor none -serial stdio -nic none -no-reboot
        -kernel "$IMG/vmlinuz" -initrd "$IMG/initrd.gz"
        -append "console=ttyS0 quiet panic=-1 clocksource=tsc tsc=reliable rxevm=$mode ${RXEVM_APPEND:-}")
    if [ -n "$share" ]; then
        qemu+=(-fsdev "local,id=hostdir,path=$share,security_model=none"
            -device "virtio-9p-pci,fsdev=hostdir,mount_tag=host")
    fi
    local log=$CACHE/console-$mode.log t0 ms status attempt
    for attempt in 1 2; do
        say "booting: ${accel%%,*}, $SMP vCPUs, $MEM"
        t0=$(date +%s%N)
        run_vm "$log" "${qemu[@]}" && break
        say "no word from the guest's init (killed after ${BOOT_TIMEOUT}s, or the VM stopped before it)"
    done
    ms=$((($(date +%s%N) - t0) / 1000000))
    # The marker may follow console escape codes on its line: match it anywhere.
    status=$(tr -d '\r' <"$log" | { grep -ao '@@RXEVM-STATUS=[0-9]*@@' || true; } | tail -n1 | tr -dc '0-9')
    say "VM ran for $ms ms; console log: $log"
    if [ -z "$status" ]; then
        say "no exit status from the guest (crash or timeout after ${TIMEOUT}s)"
        return 99
    fi
    return "$status"
}

case ${1:-} in
build)
    build_image
    ;;
run)
    [ $# -ge 3 ] || die "usage: $0 run DIR CMD [ARGS..]"
    [ -d "$2" ] || die "$2 is not a directory"
    build_image
    share=$(cd "$2" && pwd)
    shift 2
    { printf '%q ' "$@"; echo; } >"$share/.rxevm-cmd"
    status=0
    boot run "$share" || status=$?
    rm -f "$share/.rxevm-cmd"
    exit "$status"
    ;;
selftest)
    build_image
    boot selftest
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
