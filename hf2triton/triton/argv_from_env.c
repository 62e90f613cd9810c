/* LD_PRELOAD shim: keeps secret arguments off /proc/<pid>/cmdline.
 *
 * hf2triton starts tritonserver with placeholder arguments "@hf2triton-env:NAME" and the real argument in the
 * environment variable NAME. glibc runs the constructors of preloaded libraries with (argc, argv, envp)
 * before main(); this one points each placeholder's argv slot at the variable's value (the environment
 * strings live outside the argv area that /proc/<pid>/cmdline shows; /proc/<pid>/environ is mode 0400),
 * then removes NAME from the environment and sets LD_PRELOAD back to what the user had (saved in
 * HF2TRITON_LD_PRELOAD; unset if empty), so the processes tritonserver starts (the Python backend stubs)
 * inherit neither the secret nor this library. A placeholder whose variable is missing stops the
 * program: it must never run with the placeholder as its argument.
 * It also makes fchmod() honour the umask inside tritonserver: boost.interprocess (used by the Python backend)
 * fchmods every shared-memory region it creates to 0644 after shm_open, so the umask 077 hf2triton starts
 * the server with would not keep other users from reading the requests and responses in /dev/shm.
 * Built by hf2triton/triton/hidden_args.py: cc -shared -fPIC -O2 -Wall. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PREFIX "@hf2triton-env:"

static mode_t hf2triton_umask = 077;

int fchmod(int fd, mode_t mode) {
    return (int)syscall(SYS_fchmod, fd, mode & ~hf2triton_umask);
}

__attribute__((constructor)) static void hf2triton_init(int argc, char **argv, char **envp) {
    (void)envp;
    hf2triton_umask = umask(077); /* read it (no other thread runs yet) and put it back */
    umask(hf2triton_umask);
    size_t prefix_len = strlen(PREFIX);
    for (int i = 1; i < argc && argv != NULL; i++) {
        if (argv[i] == NULL || strncmp(argv[i], PREFIX, prefix_len) != 0)
            continue;
        const char *name = argv[i] + prefix_len;
        char *value = getenv(name);
        if (name[0] == '\0' || value == NULL) {
            fprintf(stderr, "hf2triton argv_from_env: argument %d is the placeholder %s but the environment has no %s; "
                            "refusing to start\n", i, argv[i], name[0] ? name : "(empty name)");
            _exit(2);
        }
        argv[i] = value; /* unsetenv only drops the pointer from environ: the string stays valid */
        unsetenv(name);
    }
    const char *keep = getenv("HF2TRITON_LD_PRELOAD");
    if (keep != NULL && keep[0] != '\0')
        setenv("LD_PRELOAD", keep, 1);
    else
        unsetenv("LD_PRELOAD");
    unsetenv("HF2TRITON_LD_PRELOAD");
}
