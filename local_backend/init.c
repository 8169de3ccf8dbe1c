/* aenv-init: pid 1 of a local-engine instance's pid namespace.
 *
 * The instance's template (_template.py) starts it with one end of a socket pair as fd 3, whose
 * other end the zygote holds, then forks the instance's runtime into the same pid namespace. It
 * says hello on fd 3 (one byte: the zygote reads this process's pid from the kernel), reaps every
 * process the kernel re-parents to it (orphans of the runtime's children) and exits when fd 3
 * reaches end of file: the zygote closed it, or died. Its exit ends the pid namespace, and the
 * kernel kills whatever is left in it.
 *
 * Being a small program instead of a fork of the ~90 MB template saves a page-table copy and its
 * teardown per instance. Built once per machine by _init.py (cc -O2), cached by source hash.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) { /* arguments (owner, instance id) only label the process for ps */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) != 0) return 1;
    int children = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (children < 0) return 1;
    struct pollfd watch[2] = {{.fd = 3, .events = POLLIN}, {.fd = children, .events = POLLIN}};
    char buffer[256];
    if (write(3, "i", 1) != 1) return 1;
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (poll(watch, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        if (watch[1].revents) {
            struct signalfd_siginfo info;
            while (read(children, &info, sizeof info) == sizeof info) {
            }
        }
        if (watch[0].revents) {
            ssize_t got = read(3, buffer, sizeof buffer);
            if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) return 0;
        }
    }
}
