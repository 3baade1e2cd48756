/* rt_loadcheck.c: what xtc_module_load checks before and after dlopen, so that a file that is not a
 * module for this machine is an error naming the problem instead of a crash or a SIGILL:
 *
 *  - rt_elf_check, before dlopen: the file is an ELF shared object of this machine's class, byte
 *    order and architecture, and every program header, segment and the section header table lies
 *    inside the file. dlopen maps segments without comparing them with the file size, and touching
 *    a mapped page past the end of a truncated file raises SIGBUS inside the dynamic loader.
 *  - rt_cpu_missing, after the metadata is read: the CPU features the module's code was compiled
 *    for (its "requires" option, LLVM's feature names) are all present on the running CPU (x86-64:
 *    CPUID, and XGETBV for the register state the OS saves).
 *
 * These checks catch accidents (a truncated copy, a module built on another machine), not attacks:
 * a module is native code, and a hostile one can do anything once loaded (README, trust model). */
#include "rt_internal.h"
#include "rt_fileio.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define RT_X86 1
#else
#define RT_X86 0
#endif

/* ---- ELF ---- */

#if defined(__x86_64__)
#define RT_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define RT_ELF_MACHINE EM_AARCH64
#elif defined(__riscv)
#define RT_ELF_MACHINE EM_RISCV
#elif defined(__powerpc64__)
#define RT_ELF_MACHINE EM_PPC64
#elif defined(__s390x__)
#define RT_ELF_MACHINE EM_S390
#endif

#ifdef RT_ELF_MACHINE
static const char *machine_name(unsigned m)
{
    switch (m) {
    case EM_386: return "x86 (32-bit)";
    case EM_X86_64: return "x86-64";
    case EM_AARCH64: return "AArch64";
    case EM_ARM: return "ARM (32-bit)";
    case EM_RISCV: return "RISC-V";
    case EM_PPC64: return "PowerPC64";
    case EM_S390: return "s390";
    default: return NULL;
    }
}
#endif

static int read_at(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        done += (size_t)k;
    }
    return 0;
}

/* Whether [off, off + len) lies within a file of size bytes; *end gets off + len (saturated). */
static int within(uint64_t off, uint64_t len, uint64_t size, uint64_t *end)
{
    *end = off > UINT64_MAX - len ? UINT64_MAX : off + len;
    return off <= size && len <= size - off;
}

static int check_header(const Elf64_Ehdr *eh, const char *path, uint64_t size, char *err, size_t n)
{
    if (eh->e_ident[EI_CLASS] != ELFCLASS64) {
        rt_set_error(err, n, "%s: a %s ELF file; this runtime loads 64-bit modules", path,
                     eh->e_ident[EI_CLASS] == ELFCLASS32 ? "32-bit" : "malformed (unknown class)");
        return XTC_ERR_FORMAT;
    }
    unsigned char host_data = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
    if (eh->e_ident[EI_DATA] != host_data) {
        rt_set_error(err, n, "%s: ELF file of the other byte order (%s-endian), this machine is %s-endian", path,
                     eh->e_ident[EI_DATA] == ELFDATA2LSB ? "little" : eh->e_ident[EI_DATA] == ELFDATA2MSB ? "big" : "unknown",
                     host_data == ELFDATA2LSB ? "little" : "big");
        return XTC_ERR_FORMAT;
    }
#ifdef RT_ELF_MACHINE
    if (eh->e_machine != RT_ELF_MACHINE) {
        const char *built = machine_name(eh->e_machine);
        char num[32];
        snprintf(num, sizeof num, "ELF machine %u", (unsigned)eh->e_machine);
        rt_set_error(err, n, "%s: built for %s, this machine is %s", path, built ? built : num,
                     machine_name(RT_ELF_MACHINE));
        return XTC_ERR_FORMAT;
    }
#endif
    if (eh->e_type != ET_DYN) {
        rt_set_error(err, n, "%s: ELF file of type %s, not a shared library (a module is built by xtc compile)", path,
                     eh->e_type == ET_EXEC ? "executable" : eh->e_type == ET_REL ? "relocatable object"
                     : eh->e_type == ET_CORE ? "core dump" : "unknown");
        return XTC_ERR_FORMAT;
    }
    if (eh->e_ehsize != sizeof(Elf64_Ehdr) || eh->e_phentsize != sizeof(Elf64_Phdr) ||
        (eh->e_shnum && eh->e_shentsize != sizeof(Elf64_Shdr))) {
        rt_set_error(err, n, "%s: malformed ELF header (header or table entry sizes %u, %u, %u)", path,
                     (unsigned)eh->e_ehsize, (unsigned)eh->e_phentsize, (unsigned)eh->e_shentsize);
        return XTC_ERR_FORMAT;
    }
    if (eh->e_phnum == 0 || eh->e_phnum == PN_XNUM) {
        rt_set_error(err, n, "%s: malformed ELF header (%u program headers)", path, (unsigned)eh->e_phnum);
        return XTC_ERR_FORMAT;
    }
    uint64_t end;
    if (!within(eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr), size, &end)) {
        rt_set_error(err, n, "%s: truncated: the program headers end at byte %llu but the file has %llu bytes",
                     path, (unsigned long long)end, (unsigned long long)size);
        return XTC_ERR_FORMAT;
    }
    return XTC_OK;
}

static int check_segments(int fd, const Elf64_Ehdr *eh, const char *path, uint64_t size, char *err, size_t n)
{
    int nload = 0;
    for (unsigned i = 0; i < eh->e_phnum; i++) {
        Elf64_Phdr ph;
        if (read_at(fd, &ph, sizeof ph, eh->e_phoff + (uint64_t)i * sizeof ph) < 0) {
            rt_set_error(err, n, "%s: cannot read program header %u", path, i);
            return XTC_ERR_IO;
        }
        uint64_t end;
        if (ph.p_filesz && !within(ph.p_offset, ph.p_filesz, size, &end)) {
            rt_set_error(err, n, "%s: truncated: segment %u ends at byte %llu but the file has %llu bytes", path, i,
                         (unsigned long long)end, (unsigned long long)size);
            return XTC_ERR_FORMAT;
        }
        if (ph.p_type != PT_LOAD)
            continue;
        nload++;
        if (ph.p_filesz > ph.p_memsz || ph.p_vaddr > UINT64_MAX - ph.p_memsz ||
            (ph.p_align > 1 && ((ph.p_align & (ph.p_align - 1)) || (ph.p_vaddr - ph.p_offset) % ph.p_align))) {
            rt_set_error(err, n, "%s: malformed ELF file: loadable segment %u has inconsistent sizes or alignment",
                         path, i);
            return XTC_ERR_FORMAT;
        }
    }
    if (!nload) {
        rt_set_error(err, n, "%s: malformed ELF file: no loadable segment", path);
        return XTC_ERR_FORMAT;
    }
    /* not read by dlopen, but at the end of the file: a cut past the last segment shows here */
    uint64_t end;
    if (eh->e_shnum && !within(eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr), size, &end)) {
        rt_set_error(err, n, "%s: truncated: the section headers end at byte %llu but the file has %llu bytes",
                     path, (unsigned long long)end, (unsigned long long)size);
        return XTC_ERR_FORMAT;
    }
    return XTC_OK;
}

int rt_elf_check(const char *path, char *err, size_t n)
{
    struct stat st; /* a FIFO is refused, not waited on */
    char why[600];
    int fd = rt_file_open_read(path, 1, &st, why, sizeof why);
    if (fd < 0) {
        if (errno == ENOENT || errno == EACCES) /* open's own failure */
            rt_set_error(err, n, "cannot open module %s: %s", path, strerror(errno));
        else
            rt_set_error(err, n, "cannot load module %s", why);
        return XTC_ERR_IO;
    }
    uint64_t size = (uint64_t)st.st_size;
    Elf64_Ehdr eh;
    memset(&eh, 0, sizeof eh);
    size_t got = size < sizeof eh ? (size_t)size : sizeof eh;
    int status = XTC_OK;
    if (read_at(fd, &eh, got, 0) < 0) {
        rt_set_error(err, n, "cannot read module %s: %s", path, strerror(errno));
        status = XTC_ERR_IO;
    } else if (got < SELFMAG || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
        rt_set_error(err, n, "%s is not an ELF file (%llu bytes; a module is a shared library made by xtc compile)",
                     path, (unsigned long long)size);
        status = XTC_ERR_FORMAT;
    } else if (got < EI_NIDENT || (eh.e_ident[EI_CLASS] == ELFCLASS64 && got < sizeof eh)) {
        rt_set_error(err, n, "%s: truncated: %llu bytes, shorter than the ELF header (%zu bytes)", path,
                     (unsigned long long)size, sizeof eh);
        status = XTC_ERR_FORMAT;
    } else {
        status = check_header(&eh, path, size, err, n);
        if (status == XTC_OK)
            status = check_segments(fd, &eh, path, size, err, n);
    }
    close(fd);
    return status;
}

/* ---- CPU features ---- */

#if RT_X86
enum { EAX, EBX, ECX, EDX };

/* Register state the OS must save for a feature's registers (XCR0 bits). */
#define XS_YMM 0x6u     /* SSE, AVX */
#define XS_ZMM 0xe6u    /* + opmask, ZMM_Hi256, Hi16_ZMM */
#define XS_TILE 0x60000u /* XTILECFG, XTILEDATA */

/* A CPU feature by its LLVM name: CPUID leaf, subleaf, register and bit, and the XCR0 state. */
typedef struct {
    const char *name;
    uint32_t leaf, sub;
    uint8_t reg, bit;
    uint32_t xsave;
} CpuFeature;

static const CpuFeature cpu_features[] = {
    {"cx8", 1, 0, EDX, 8, 0}, {"cmov", 1, 0, EDX, 15, 0}, {"mmx", 1, 0, EDX, 23, 0},
    {"fxsr", 1, 0, EDX, 24, 0}, {"sse", 1, 0, EDX, 25, 0}, {"sse2", 1, 0, EDX, 26, 0},
    {"sse3", 1, 0, ECX, 0, 0}, {"pclmul", 1, 0, ECX, 1, 0}, {"ssse3", 1, 0, ECX, 9, 0},
    {"fma", 1, 0, ECX, 12, XS_YMM}, {"cx16", 1, 0, ECX, 13, 0}, {"sse4.1", 1, 0, ECX, 19, 0},
    {"sse4.2", 1, 0, ECX, 20, 0}, {"crc32", 1, 0, ECX, 20, 0}, {"movbe", 1, 0, ECX, 22, 0},
    {"popcnt", 1, 0, ECX, 23, 0}, {"aes", 1, 0, ECX, 25, 0}, {"xsave", 1, 0, ECX, 26, 0},
    {"avx", 1, 0, ECX, 28, XS_YMM}, {"f16c", 1, 0, ECX, 29, XS_YMM}, {"rdrnd", 1, 0, ECX, 30, 0},
    {"fsgsbase", 7, 0, EBX, 0, 0}, {"bmi", 7, 0, EBX, 3, 0}, {"avx2", 7, 0, EBX, 5, XS_YMM},
    {"bmi2", 7, 0, EBX, 8, 0}, {"invpcid", 7, 0, EBX, 10, 0}, {"avx512f", 7, 0, EBX, 16, XS_ZMM},
    {"avx512dq", 7, 0, EBX, 17, XS_ZMM}, {"rdseed", 7, 0, EBX, 18, 0}, {"adx", 7, 0, EBX, 19, 0},
    {"avx512ifma", 7, 0, EBX, 21, XS_ZMM}, {"clflushopt", 7, 0, EBX, 23, 0}, {"clwb", 7, 0, EBX, 24, 0},
    {"avx512cd", 7, 0, EBX, 28, XS_ZMM}, {"sha", 7, 0, EBX, 29, 0}, {"avx512bw", 7, 0, EBX, 30, XS_ZMM},
    {"avx512vl", 7, 0, EBX, 31, XS_ZMM}, {"avx512vbmi", 7, 0, ECX, 1, XS_ZMM}, {"pku", 7, 0, ECX, 3, 0},
    {"waitpkg", 7, 0, ECX, 5, 0}, {"avx512vbmi2", 7, 0, ECX, 6, XS_ZMM}, {"shstk", 7, 0, ECX, 7, 0},
    {"gfni", 7, 0, ECX, 8, 0}, {"vaes", 7, 0, ECX, 9, XS_YMM}, {"vpclmulqdq", 7, 0, ECX, 10, XS_YMM},
    {"avx512vnni", 7, 0, ECX, 11, XS_ZMM}, {"avx512bitalg", 7, 0, ECX, 12, XS_ZMM},
    {"avx512vpopcntdq", 7, 0, ECX, 14, XS_ZMM}, {"rdpid", 7, 0, ECX, 22, 0}, {"movdiri", 7, 0, ECX, 27, 0},
    {"movdir64b", 7, 0, ECX, 28, 0}, {"enqcmd", 7, 0, ECX, 29, 0}, {"uintr", 7, 0, EDX, 5, 0},
    {"avx512vp2intersect", 7, 0, EDX, 8, XS_ZMM}, {"serialize", 7, 0, EDX, 14, 0},
    {"tsxldtrk", 7, 0, EDX, 16, 0}, {"amx-bf16", 7, 0, EDX, 22, XS_TILE},
    {"avx512fp16", 7, 0, EDX, 23, XS_ZMM}, {"amx-tile", 7, 0, EDX, 24, XS_TILE},
    {"amx-int8", 7, 0, EDX, 25, XS_TILE}, {"avxvnni", 7, 1, EAX, 4, XS_YMM},
    {"avx512bf16", 7, 1, EAX, 5, XS_ZMM}, {"cmpccxadd", 7, 1, EAX, 7, 0}, {"amx-fp16", 7, 1, EAX, 21, XS_TILE},
    {"avxifma", 7, 1, EAX, 23, XS_YMM}, {"avxvnniint8", 7, 1, EDX, 4, XS_YMM},
    {"avxneconvert", 7, 1, EDX, 5, XS_YMM}, {"xsaveopt", 0xd, 1, EAX, 0, 0}, {"xsavec", 0xd, 1, EAX, 1, 0},
    {"xsaves", 0xd, 1, EAX, 3, 0}, {"sahf", 0x80000001, 0, ECX, 0, 0}, {"lzcnt", 0x80000001, 0, ECX, 5, 0},
    {"sse4a", 0x80000001, 0, ECX, 6, 0}, {"prfchw", 0x80000001, 0, ECX, 8, 0},
    {"xop", 0x80000001, 0, ECX, 11, XS_YMM}, {"fma4", 0x80000001, 0, ECX, 16, XS_YMM},
    {"tbm", 0x80000001, 0, ECX, 21, 0}, {"clzero", 0x80000008, 0, EBX, 0, 0},
    {"wbnoinvd", 0x80000008, 0, EBX, 9, 0},
};
#endif

/* 1 present, 0 absent, -1 not a feature this runtime can check (unknown name, or not x86). */
int rt_cpu_has(const char *name, size_t len)
{
#if RT_X86
    for (size_t i = 0; i < sizeof cpu_features / sizeof cpu_features[0]; i++) {
        const CpuFeature *f = &cpu_features[i];
        if (strlen(f->name) != len || strncmp(f->name, name, len) != 0)
            continue;
        unsigned r[4] = {0, 0, 0, 0};
        unsigned top = __get_cpuid_max(f->leaf & 0x80000000u, NULL);
        if (top < f->leaf || !__get_cpuid_count(f->leaf, f->sub, &r[EAX], &r[EBX], &r[ECX], &r[EDX]))
            return 0;
        if (!((r[f->reg] >> f->bit) & 1))
            return 0;
        if (f->xsave) {
            unsigned a, b, c, d;
            if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) /* OSXSAVE: XGETBV usable */
                return 0;
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            if ((lo & f->xsave) != f->xsave)
                return 0;
        }
        return 1;
    }
    return -1;
#else
    (void)name;
    (void)len;
    return -1;
#endif
}

int rt_cpu_missing(const char *features, char *missing, size_t n)
{
    int count = 0;
    size_t used = 0;
    if (n)
        missing[0] = 0;
    for (const char *p = features; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *name = p;
        size_t nlen = len;
        if (nlen && *name == '+') { /* LLVM's "+feature" form; "-feature" requires nothing */
            name++;
            nlen--;
        }
        if (nlen && *p != '-' && rt_cpu_has(name, nlen) == 0) {
            if (used < n) {
                int k = snprintf(missing + used, n - used, "%s%.*s", count ? ", " : "", (int)nlen, name);
                used = k < 0 || (size_t)k >= n - used ? n : used + (size_t)k;
            }
            count++;
        }
        p += len + (comma != NULL);
    }
    return count;
}
