/* The stand-in for a Python process the fork server forked (daemon/ops/fork_server.py): what Spark's process
 * becomes once its launcher (daemon/ops/fork_launcher.py) has handed the request over and the server has forked
 * the child. It does what the launcher would do while the child runs, in about 0.2 MiB instead of the 3 MiB an
 * interpreter holds: one stays for each streaming source's runner, for the query's life.
 *
 *   lakefeed-stand-in <server connection fd> <child pid> [what it stands in for...]
 *
 * - Signals Spark sends (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) go to the child. The launcher blocks
 *   them before its exec: one that came meanwhile waits, and is forwarded once the handlers are in place.
 * - The server writes the child's exit status on the connection (4 bytes, big-endian, negative: the signal that
 *   ended it). The stand-in ends the same way: by that signal, or with that code.
 * - The connection's end without a status means the server is gone: nothing would reap or report the child, so
 *   it is killed, and the stand-in exits 1.
 * The arguments after the pid are not read: they show in `ps` what the process stands in for.
 * Built by `make setup` into the venv's bin (Makefile); without a C compiler, the launcher stands in itself. */

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const int FORWARDED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
static volatile pid_t child;

static void forward(int signum) {
    int saved = errno;
    kill(child, signum);
    errno = saved;
}

/* The number in `text`, or -1 if it is not a whole positive one. */
static long number(const char *text) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    return errno || *text == '\0' || *end != '\0' || value <= 0 ? -1 : value;
}

int main(int argc, char **argv) {
    long fd = argc >= 3 ? number(argv[1]) : -1, pid = argc >= 3 ? number(argv[2]) : -1;
    if (fd < 0 || pid < 0) {
        fputs("usage: lakefeed-stand-in <server connection fd> <child pid> [what it stands in for...]\n", stderr);
        return 2;
    }
    child = (pid_t)pid;
    struct sigaction action = {.sa_handler = forward, .sa_flags = SA_RESTART};
    sigemptyset(&action.sa_mask);
    sigset_t forwarded;
    sigemptyset(&forwarded);
    for (size_t i = 0; i < sizeof FORWARDED / sizeof *FORWARDED; i++) {
        sigaction(FORWARDED[i], &action, NULL);
        sigaddset(&forwarded, FORWARDED[i]);
    }
    sigprocmask(SIG_UNBLOCK, &forwarded, NULL);

    unsigned char status[4];
    size_t got = 0;
    while (got < sizeof status) {
        ssize_t n = read((int)fd, status + got, sizeof status - got);
        if (n > 0)
            got += (size_t)n;
        else if (n < 0 && errno == EINTR)
            continue;
        else
            break;
    }
    if (got < sizeof status) { /* the server is gone: so must the child be */
        kill(child, SIGKILL);
        return 1;
    }
    int32_t code = (int32_t)((uint32_t)status[0] << 24 | (uint32_t)status[1] << 16 | (uint32_t)status[2] << 8 |
                             (uint32_t)status[3]);
    if (code < 0 && -code < NSIG) { /* ended by a signal: so does its stand-in */
        int signum = -code;
        if (signum != SIGKILL && signum != SIGSTOP)
            signal(signum, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, signum);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        kill(getpid(), signum);
    }
    return code & 0xFF;
}
