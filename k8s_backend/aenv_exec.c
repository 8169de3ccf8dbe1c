/* aenv-exec: the exec helper of a DualContainer pod's second container (the "datasource").
 *
 * The second container's image may hold no Python and no shell, so the runtime container (which
 * serves the environment's tools) cannot run anything there by itself. An init container copies
 * this program, built statically, into a volume both containers mount (`aenv-exec --install
 * DEST`); the second container runs it as its command (`aenv-exec --socket /aenv-shared/exec.sock
 * [-- CMD ARGS...]`): it serves requests on that unix socket, and, when a command follows `--`,
 * supervises it (forwards SIGTERM, exits with its status). Only a unix socket: nothing else in
 * the pod's network can reach it.
 *
 * One request per connection, each handled in a process of its own (fork), so requests run
 * concurrently. The client is the environment's code, which is untrusted but is exactly the
 * party allowed to drive this container: the helper grants nothing beyond running as the
 * container's user, and a malformed request must never crash or confuse it. Every length is
 * checked before it is used, every string is checked for NUL bytes, unknown fields are refused.
 *
 * The wire (all integers big-endian):
 *   frame    = u32 length, then `length` bytes of body
 *   request  = u8 version (1), u8 op, fields...       ops: 1 run, 2 read, 3 write, 4 list, 5 ping
 *   response = u8 version (1), u8 status (0 ok, 1 error), fields...
 *   field    = u8 tag, u32 length, bytes
 * Request fields: 1 arg (repeated, at least one), 2 env "KEY=VALUE" (repeated), 3 cwd, 4 stdin,
 *   5 timeout_ms (u32), 6 max_output (u32, per stream), 7 path, 8 data, 9 mode (u32),
 *   10 max_size (u32), 11 parents (u8).
 * Response fields: 32 status (i32: the exit code, or -N for signal N), 33 stdout, 34 stderr,
 *   35 flags (u8: 1 timed out, 2 stdout truncated, 4 stderr truncated), 36 content, 37 entry
 *   (u8 kind 1 file 2 directory 3 symlink 0 other, u32 mode, u64 size, name), 38 version,
 *   39 size (u64), 48 error kind (u8: 1 bad request, 2 os error, 3 too large, 4 busy, 5 the
 *   command could not start), 49 errno (u32), 50 message.
 * While a command runs the client keeps the connection open; closing it cancels the command
 * (its process group is killed). k8s_backend/exec_helper.py builds this file; aenv_ray/datasource.py
 * is the client.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define VERSION "aenv-exec 1"
#define PROTOCOL 1
#define MAX_DATA (64u << 20)              /* a file's content, a command's stdin */
#define MAX_REQUEST (MAX_DATA + (1u << 20)) /* the data plus every other field */
#define MAX_OUTPUT (16u << 20)            /* per stream of a command */
#define DEFAULT_OUTPUT (1u << 20)
#define DEFAULT_READ (16u << 20)
#define MAX_ITEMS 4096                    /* args, env entries */
#define MAX_HANDLERS 256                  /* requests at once */
#define MAX_ENTRIES 100000                /* a directory listing */
#define IO_SECONDS 60                     /* a stalled client's request or answer */
#define DEFAULT_TIMEOUT_MS (600u * 1000u)
#define MAX_TIMEOUT_MS (24u * 3600u * 1000u)

enum { OP_RUN = 1, OP_READ, OP_WRITE, OP_LIST, OP_PING };
enum {
    T_ARG = 1, T_ENV, T_CWD, T_STDIN, T_TIMEOUT_MS, T_MAX_OUTPUT, T_PATH, T_DATA, T_MODE,
    T_MAX_SIZE, T_PARENTS,
    T_STATUS = 32, T_STDOUT, T_STDERR, T_FLAGS, T_CONTENT, T_ENTRY, T_VERSION, T_SIZE,
    T_KIND = 48, T_ERRNO, T_MESSAGE
};
enum { K_BAD_REQUEST = 1, K_OS, K_TOO_LARGE, K_BUSY, K_START };

extern char **environ;

/* -- growable bytes --------------------------------------------------------------------------- */

struct buf {
    unsigned char *p;
    size_t len, cap;
};

static void reserve(struct buf *b, size_t more) {
    if (more > SIZE_MAX / 2 - b->len) _exit(3);
    size_t need = b->len + more;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) _exit(3); /* out of memory: the client sees the connection close */
    b->p = p;
    b->cap = cap;
}

static void put(struct buf *b, const void *data, size_t n) {
    if (n == 0) return;
    reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_be(struct buf *b, uint64_t v, int bytes) {
    unsigned char tmp[8];
    for (int i = 0; i < bytes; i++) tmp[i] = (unsigned char)(v >> (8 * (bytes - 1 - i)));
    put(b, tmp, (size_t)bytes);
}

static void field(struct buf *b, int tag, const void *data, size_t n) {
    put_be(b, (uint64_t)tag, 1);
    put_be(b, n, 4);
    put(b, data, n);
}

static void field_int(struct buf *b, int tag, uint64_t v, int bytes) {
    put_be(b, (uint64_t)tag, 1);
    put_be(b, (uint64_t)bytes, 4);
    put_be(b, v, bytes);
}

static uint64_t get_be(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | p[i];
    return v;
}

/* -- plain I/O ----------------------------------------------------------------------------------- */

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, unsigned char *p, size_t n) { /* 0, or -1 on error or early EOF */
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void send_frame(int conn, struct buf *body) { /* one writev: header and body together */
    unsigned char head[4];
    for (int i = 0; i < 4; i++) head[i] = (unsigned char)(body->len >> (8 * (3 - i)));
    struct iovec parts[2] = {{head, 4}, {body->p, body->len}};
    ssize_t sent;
    do sent = writev(conn, parts, 2);
    while (sent < 0 && errno == EINTR);
    if (sent < 0 || (size_t)sent == 4 + body->len) return;
    if ((size_t)sent < 4) {
        if (write_all(conn, head + sent, 4 - (size_t)sent) != 0) return;
        sent = 4;
    }
    write_all(conn, body->p + (sent - 4), body->len - (size_t)(sent - 4));
}

static void begin(struct buf *b, int status) {
    b->len = 0;
    put_be(b, PROTOCOL, 1);
    put_be(b, (uint64_t)status, 1);
}

/* Answer an error and end this handler. */
__attribute__((noreturn, format(printf, 4, 5))) static void fail(int conn, int kind, int err,
                                                                 const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof message) n = sizeof message - 1;
    struct buf b = {0};
    begin(&b, 1);
    field_int(&b, T_KIND, (uint64_t)kind, 1);
    field_int(&b, T_ERRNO, (uint64_t)(uint32_t)err, 4);
    field(&b, T_MESSAGE, message, (size_t)n);
    send_frame(conn, &b);
    _exit(0);
}

/* -- the request ------------------------------------------------------------------------------ */

struct bytes {
    const unsigned char *p;
    uint32_t n;
};

struct request {
    int op;
    char **argv, **env;
    size_t argc, envc;
    char *cwd, *path;
    struct bytes input, data;
    uint32_t timeout_ms, max_output, mode, max_size;
    int parents, has_mode;
};

static const char *tag_name(int tag) {
    static const char *names[] = {"?",    "arg",  "env",  "cwd",      "stdin",  "timeout_ms",
                                  "max_output", "path", "data", "mode", "max_size", "parents"};
    return tag >= 1 && tag <= T_PARENTS ? names[tag] : "?";
}

/* The fields each op accepts (bit = 1 << tag). */
static uint32_t allowed(int op) {
    switch (op) {
    case OP_RUN:
        return 1u << T_ARG | 1u << T_ENV | 1u << T_CWD | 1u << T_STDIN | 1u << T_TIMEOUT_MS |
               1u << T_MAX_OUTPUT;
    case OP_READ: return 1u << T_PATH | 1u << T_MAX_SIZE;
    case OP_WRITE: return 1u << T_PATH | 1u << T_DATA | 1u << T_MODE | 1u << T_PARENTS;
    case OP_LIST: return 1u << T_PATH;
    case OP_PING: return 0;
    default: return 0;
    }
}

static char *text(int conn, int tag, const unsigned char *p, uint32_t n) {
    if (memchr(p, 0, n))
        fail(conn, K_BAD_REQUEST, EINVAL, "field %s holds a NUL byte", tag_name(tag));
    char *s = malloc((size_t)n + 1);
    if (!s) _exit(3);
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static void push(int conn, char ***items, size_t *count, char *item, const char *what) {
    if (*count >= MAX_ITEMS) fail(conn, K_BAD_REQUEST, E2BIG, "more than %d %s", MAX_ITEMS, what);
    char **grown = realloc(*items, (*count + 2) * sizeof **items);
    if (!grown) _exit(3);
    grown[(*count)++] = item;
    grown[*count] = NULL;
    *items = grown;
}

static uint32_t number(int conn, int tag, const unsigned char *p, uint32_t n, int bytes) {
    if (n != (uint32_t)bytes)
        fail(conn, K_BAD_REQUEST, EINVAL, "field %s must be %d bytes, not %u", tag_name(tag),
             bytes, n);
    return (uint32_t)get_be(p, bytes);
}

static void parse(int conn, const unsigned char *body, uint32_t len, struct request *r) {
    if (len < 2) fail(conn, K_BAD_REQUEST, EINVAL, "a request is at least 2 bytes");
    if (body[0] != PROTOCOL)
        fail(conn, K_BAD_REQUEST, EPROTO, "protocol version %u; this helper speaks %d", body[0],
             PROTOCOL);
    memset(r, 0, sizeof *r);
    r->op = body[1];
    if (r->op < OP_RUN || r->op > OP_PING) fail(conn, K_BAD_REQUEST, EINVAL, "unknown op %d", r->op);
    r->timeout_ms = DEFAULT_TIMEOUT_MS;
    r->max_output = DEFAULT_OUTPUT;
    r->max_size = DEFAULT_READ;
    uint32_t ok = allowed(r->op), seen = 0, pos = 2;
    while (pos < len) {
        if (len - pos < 5) fail(conn, K_BAD_REQUEST, EINVAL, "a field is cut short at byte %u", pos);
        int tag = body[pos];
        uint32_t n = (uint32_t)get_be(body + pos + 1, 4);
        pos += 5;
        if (n > len - pos)
            fail(conn, K_BAD_REQUEST, EINVAL, "field %d says %u bytes, %u are left", tag, n,
                 len - pos);
        const unsigned char *p = body + pos;
        pos += n;
        if (tag < 1 || tag > T_PARENTS || !(ok & (1u << tag)))
            fail(conn, K_BAD_REQUEST, EINVAL, "field %d is not one of op %d's", tag, r->op);
        if (tag != T_ARG && tag != T_ENV) {
            if (seen & (1u << tag))
                fail(conn, K_BAD_REQUEST, EINVAL, "field %s given twice", tag_name(tag));
            seen |= 1u << tag;
        }
        switch (tag) {
        case T_ARG: push(conn, &r->argv, &r->argc, text(conn, tag, p, n), "args"); break;
        case T_ENV: {
            char *entry = text(conn, tag, p, n);
            char *eq = strchr(entry, '=');
            if (!eq || eq == entry)
                fail(conn, K_BAD_REQUEST, EINVAL, "an env entry is not KEY=VALUE");
            push(conn, &r->env, &r->envc, entry, "env entries");
            break;
        }
        case T_CWD: r->cwd = text(conn, tag, p, n); break;
        case T_PATH: r->path = text(conn, tag, p, n); break;
        case T_STDIN: r->input = (struct bytes){p, n}; break;
        case T_DATA: r->data = (struct bytes){p, n}; break;
        case T_TIMEOUT_MS:
            r->timeout_ms = number(conn, tag, p, n, 4);
            if (r->timeout_ms == 0 || r->timeout_ms > MAX_TIMEOUT_MS)
                fail(conn, K_BAD_REQUEST, EINVAL, "timeout_ms must be 1..%u", MAX_TIMEOUT_MS);
            break;
        case T_MAX_OUTPUT:
            r->max_output = number(conn, tag, p, n, 4);
            if (r->max_output > MAX_OUTPUT)
                fail(conn, K_BAD_REQUEST, EINVAL, "max_output is at most %u", MAX_OUTPUT);
            break;
        case T_MODE:
            r->mode = number(conn, tag, p, n, 4);
            r->has_mode = 1;
            if (r->mode & ~07777u) fail(conn, K_BAD_REQUEST, EINVAL, "mode %o is not a file mode", r->mode);
            break;
        case T_MAX_SIZE:
            r->max_size = number(conn, tag, p, n, 4);
            if (r->max_size > MAX_DATA)
                fail(conn, K_BAD_REQUEST, EINVAL, "max_size is at most %u", MAX_DATA);
            break;
        case T_PARENTS: r->parents = number(conn, tag, p, n, 1) != 0; break;
        }
    }
    if (r->op == OP_RUN && r->argc == 0) fail(conn, K_BAD_REQUEST, EINVAL, "run needs an arg");
    if ((r->op == OP_READ || r->op == OP_WRITE || r->op == OP_LIST) && !r->path)
        fail(conn, K_BAD_REQUEST, EINVAL, "this op needs a path");
    if (r->path && !r->path[0]) fail(conn, K_BAD_REQUEST, EINVAL, "the path is empty");
}

/* -- run ------------------------------------------------------------------------------------- */

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The command's environment: this process's, with the request's entries set over it. */
static char **environment(struct request *r) {
    size_t mine = 0;
    while (environ[mine]) mine++;
    char **env = calloc(mine + r->envc + 1, sizeof *env);
    if (!env) _exit(3);
    size_t n = 0;
    for (size_t i = 0; i < mine; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t key = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        int replaced = 0;
        for (size_t j = 0; j < r->envc && !replaced; j++)
            replaced = strncmp(r->env[j], environ[i], key) == 0 && r->env[j][key] == '=';
        if (!replaced) env[n++] = environ[i];
    }
    for (size_t j = 0; j < r->envc; j++) { /* the last of duplicate keys wins */
        size_t key = (size_t)(strchr(r->env[j], '=') - r->env[j]);
        int later = 0;
        for (size_t k = j + 1; k < r->envc && !later; k++)
            later = strncmp(r->env[k], r->env[j], key + 1) == 0;
        if (!later) env[n++] = r->env[j];
    }
    env[n] = NULL;
    return env;
}

struct stream {
    int fd;
    struct buf out;
    uint32_t limit;
    int truncated;
};

static void take(struct stream *s) { /* read what is there; close at EOF */
    unsigned char chunk[65536];
    ssize_t got = read(s->fd, chunk, sizeof chunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (got <= 0) {
        close(s->fd);
        s->fd = -1;
        return;
    }
    size_t room = s->limit - s->out.len;
    size_t keep = (size_t)got < room ? (size_t)got : room;
    put(&s->out, chunk, keep);
    if (keep < (size_t)got) s->truncated = 1;
}

static void run(int conn, struct request *r) {
    int in[2], out[2], err[2], report[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
        pipe2(report, O_CLOEXEC))
        fail(conn, K_OS, errno, "cannot make pipes: %s", strerror(errno));
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int children = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (children < 0) fail(conn, K_OS, errno, "signalfd: %s", strerror(errno));
    char **env = environment(r);
    pid_t pid = fork();
    if (pid < 0) fail(conn, K_OS, errno, "cannot fork: %s", strerror(errno));
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
        setsid(); /* its own process group: a timeout or a cancel kills all of it */
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0) _exit(127);
        int stage = 0;
        if (r->cwd && chdir(r->cwd) != 0) stage = 1;
        if (!stage) {
            environ = env;
            execvp(r->argv[0], r->argv);
            stage = 2;
        }
        unsigned char why[8];
        uint32_t code = (uint32_t)errno;
        for (int i = 0; i < 4; i++) why[i] = (unsigned char)(stage >> (8 * (3 - i)));
        for (int i = 0; i < 4; i++) why[4 + i] = (unsigned char)(code >> (8 * (3 - i)));
        write_all(report[1], why, 8);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    close(report[1]);
    unsigned char why[8];
    ssize_t got;
    do got = read(report[0], why, sizeof why);
    while (got < 0 && errno == EINTR);
    close(report[0]);
    if (got == 8) { /* it never ran */
        waitpid(pid, NULL, 0);
        int stage = (int)get_be(why, 4), code = (int)get_be(why + 4, 4);
        if (stage == 1)
            fail(conn, K_START, code, "cannot enter %s: %s", r->cwd, strerror(code));
        fail(conn, K_START, code, "cannot run %s: %s", r->argv[0], strerror(code));
    }

    struct stream streams[2] = {{.fd = out[0], .limit = r->max_output},
                                {.fd = err[0], .limit = r->max_output}};
    int input = in[1];
    size_t fed = 0;
    if (r->input.n == 0) {
        close(input);
        input = -1;
    } else {
        fcntl(input, F_SETFL, O_NONBLOCK);
    }
    int64_t deadline = now_ms() + r->timeout_ms;
    int timed_out = 0, exited = 0, cancelled = 0, status = 0;
    while (!exited) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd fds[5] = {{.fd = streams[0].fd, .events = POLLIN},
                                {.fd = streams[1].fd, .events = POLLIN},
                                {.fd = input, .events = POLLOUT},
                                {.fd = conn, .events = POLLIN},
                                {.fd = children, .events = POLLIN}};
        if (poll(fds, 5, left > INT_MAX ? INT_MAX : (int)left) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; i++)
            if (streams[i].fd >= 0 && fds[i].revents) take(&streams[i]);
        if (input >= 0 && fds[2].revents) {
            ssize_t w = write(input, r->input.p + fed, r->input.n - fed);
            if (w > 0) fed += (size_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || fed == r->input.n) {
                close(input); /* done, or the command closed its stdin */
                input = -1;
            }
        }
        if (fds[3].revents) { /* the client hung up (or broke the protocol): cancel */
            cancelled = 1;
            break;
        }
        if (fds[4].revents) {
            struct signalfd_siginfo info;
            while (read(children, &info, sizeof info) == sizeof info) {
            }
            siginfo_t state = {0};
            if (waitid(P_PID, (id_t)pid, &state, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                state.si_pid == pid)
                exited = 1; /* still a zombie: its group id cannot be reused yet */
        }
    }
    kill(-pid, SIGKILL); /* what it left behind in its group, or all of it on timeout/cancel */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (cancelled) _exit(0);
    if (input >= 0) close(input);
    for (;;) { /* drain what is already written; a process that left the group is not waited for */
        struct pollfd fds[2] = {{.fd = streams[0].fd, .events = POLLIN},
                                {.fd = streams[1].fd, .events = POLLIN}};
        if (fds[0].fd < 0 && fds[1].fd < 0) break;
        int ready = poll(fds, 2, 50);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) break;
        for (int i = 0; i < 2; i++)
            if (streams[i].fd >= 0 && fds[i].revents) take(&streams[i]);
    }
    int32_t code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
    struct buf b = {0};
    begin(&b, 0);
    field_int(&b, T_STATUS, (uint32_t)code, 4);
    field(&b, T_STDOUT, streams[0].out.p, streams[0].out.len);
    field(&b, T_STDERR, streams[1].out.p, streams[1].out.len);
    field_int(&b, T_FLAGS,
              (uint64_t)(timed_out | streams[0].truncated << 1 | streams[1].truncated << 2), 1);
    send_frame(conn, &b);
}

/* -- files ----------------------------------------------------------------------------------- */

static void read_file(int conn, struct request *r) {
    int fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) fail(conn, K_OS, errno, "cannot open %s: %s", r->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fail(conn, K_OS, errno, "cannot stat %s: %s", r->path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fail(conn, K_OS, EISDIR, "%s is a directory", r->path);
    if (!S_ISREG(st.st_mode)) fail(conn, K_OS, EINVAL, "%s is not a regular file", r->path);
    fcntl(fd, F_SETFL, 0);
    struct buf b = {0};
    begin(&b, 0);
    size_t head = b.len;
    put_be(&b, T_CONTENT, 1);
    put_be(&b, 0, 4); /* the length, set below */
    size_t start = b.len, limit = (size_t)r->max_size + 1; /* one more: is there more? */
    for (;;) {
        size_t have = b.len - start;
        if (have >= limit) break;
        size_t want = limit - have < 65536 ? limit - have : 65536;
        reserve(&b, want);
        ssize_t got = read(fd, b.p + b.len, want);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail(conn, K_OS, errno, "cannot read %s: %s", r->path, strerror(errno));
        if (got == 0) break;
        b.len += (size_t)got;
    }
    close(fd);
    size_t n = b.len - start;
    if (n > r->max_size)
        fail(conn, K_TOO_LARGE, EFBIG, "%s is %lld bytes, over the limit of %u", r->path,
             (long long)st.st_size, r->max_size);
    for (int i = 0; i < 4; i++) b.p[head + 1 + i] = (unsigned char)(n >> (8 * (3 - i)));
    field_int(&b, T_SIZE, n, 8);
    send_frame(conn, &b);
}

static int make_parents(char *path) { /* mkdir -p of path's directory */
    for (char *slash = strchr(path + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        int made = mkdir(path, 0755);
        int error = errno;
        *slash = '/';
        if (made != 0 && error != EEXIST) {
            errno = error;
            return -1;
        }
    }
    return 0;
}

static void write_file(int conn, struct request *r) {
    if (r->parents && make_parents(r->path) != 0)
        fail(conn, K_OS, errno, "cannot make the directories of %s: %s", r->path, strerror(errno));
    umask(0);
    mode_t mode = r->has_mode ? (mode_t)r->mode : 0644;
    /* O_NONBLOCK: a FIFO with no reader fails at once instead of blocking */
    int fd = open(r->path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, mode);
    if (fd < 0) fail(conn, K_OS, errno, "cannot open %s: %s", r->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fail(conn, K_OS, errno, "cannot stat %s: %s", r->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(conn, K_OS, EINVAL, "%s is not a regular file", r->path);
    fcntl(fd, F_SETFL, 0);
    if (ftruncate(fd, 0) != 0 || (r->has_mode && fchmod(fd, mode) != 0) ||
        write_all(fd, r->data.p, r->data.n) != 0)
        fail(conn, K_OS, errno, "cannot write %s: %s", r->path, strerror(errno));
    if (close(fd) != 0) fail(conn, K_OS, errno, "cannot write %s: %s", r->path, strerror(errno));
    struct buf b = {0};
    begin(&b, 0);
    field_int(&b, T_SIZE, r->data.n, 8);
    send_frame(conn, &b);
}

static void list_dir(int conn, struct request *r) {
    DIR *dir = opendir(r->path);
    if (!dir) fail(conn, K_OS, errno, "cannot list %s: %s", r->path, strerror(errno));
    struct buf b = {0};
    begin(&b, 0);
    size_t count = 0;
    struct dirent *entry;
    while ((errno = 0, entry = readdir(dir)) != NULL) {
        const char *name = entry->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
        struct stat st;
        if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone since */
        if (++count > MAX_ENTRIES)
            fail(conn, K_TOO_LARGE, E2BIG, "%s holds more than %d entries", r->path, MAX_ENTRIES);
        int kind = S_ISREG(st.st_mode) ? 1 : S_ISDIR(st.st_mode) ? 2 : S_ISLNK(st.st_mode) ? 3 : 0;
        size_t n = strlen(name);
        put_be(&b, T_ENTRY, 1);
        put_be(&b, 13 + n, 4);
        put_be(&b, (uint64_t)kind, 1);
        put_be(&b, st.st_mode & 07777, 4);
        put_be(&b, (uint64_t)st.st_size, 8);
        put(&b, name, n);
    }
    if (errno) fail(conn, K_OS, errno, "cannot list %s: %s", r->path, strerror(errno));
    closedir(dir);
    send_frame(conn, &b);
}

/* -- one connection -------------------------------------------------------------------------- */

static void handle(int conn) {
    struct timeval io = {.tv_sec = IO_SECONDS};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &io, sizeof io);
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &io, sizeof io);
    unsigned char head[4];
    if (read_all(conn, head, 4) != 0) _exit(0); /* the client left */
    uint32_t len = (uint32_t)get_be(head, 4);
    if (len > MAX_REQUEST)
        fail(conn, K_BAD_REQUEST, EMSGSIZE, "a request of %u bytes is over the limit of %u", len,
             MAX_REQUEST);
    unsigned char *body = malloc(len ? len : 1);
    if (!body) _exit(3);
    if (read_all(conn, body, len) != 0) _exit(0);
    struct request r;
    parse(conn, body, len, &r);
    switch (r.op) {
    case OP_RUN: run(conn, &r); break;
    case OP_READ: read_file(conn, &r); break;
    case OP_WRITE: write_file(conn, &r); break;
    case OP_LIST: list_dir(conn, &r); break;
    case OP_PING: {
        struct buf b = {0};
        begin(&b, 0);
        field(&b, T_VERSION, VERSION, strlen(VERSION));
        send_frame(conn, &b);
        break;
    }
    }
}

static void busy(int conn) {
    static const char message[] = "the helper is serving as many requests as it can; retry";
    struct buf b = {0};
    begin(&b, 1);
    field_int(&b, T_KIND, K_BUSY, 1);
    field_int(&b, T_ERRNO, EAGAIN, 4);
    field(&b, T_MESSAGE, message, sizeof message - 1);
    send_frame(conn, &b);
    free(b.p);
}

/* -- the server ------------------------------------------------------------------------------ */

static const char *socket_path;

static void die(const char *what) {
    fprintf(stderr, "aenv-exec: %s: %s\n", what, strerror(errno));
    if (socket_path) unlink(socket_path);
    exit(1);
}

static int serve(const char *path, char **command) {
    for (int fd = 0; fd < 3; fd++) /* 0, 1 and 2 open, so that pipes never take them */
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd) return 1;
    /* bound as PATH~, listening, then renamed to PATH: a client never finds it not listening */
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) + 1 >= sizeof addr.sun_path) {
        fprintf(stderr, "aenv-exec: socket path %s is %zu bytes, over the limit of %zu\n", path,
                strlen(path), sizeof addr.sun_path - 2);
        return 2;
    }
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s~", path);
    signal(SIGPIPE, SIG_IGN);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) die("sigprocmask");
    int signals = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals < 0) die("signalfd");
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            fprintf(stderr, "aenv-exec: %s exists and is not a socket; not replacing it\n", path);
            return 2;
        }
        unlink(path); /* a previous run's */
    }
    unlink(addr.sun_path);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) die("socket");
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0) die(addr.sun_path);
    if (chmod(addr.sun_path, 0660) != 0 || listen(listener, 128) != 0 ||
        rename(addr.sun_path, path) != 0) {
        unlink(addr.sun_path);
        die(path);
    }
    socket_path = path;

    pid_t main_child = 0;
    if (command && command[0]) {
        main_child = fork();
        if (main_child < 0) die("fork");
        if (main_child == 0) {
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            signal(SIGPIPE, SIG_DFL);
            execvp(command[0], command);
            fprintf(stderr, "aenv-exec: cannot run %s: %s\n", command[0], strerror(errno));
            _exit(127);
        }
    }
    fprintf(stderr, "aenv-exec: serving on %s\n", path);
    int handlers = 0;
    for (;;) {
        struct pollfd fds[2] = {{.fd = listener, .events = POLLIN}, {.fd = signals, .events = POLLIN}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if (fds[1].revents) {
            struct signalfd_siginfo info;
            while (read(signals, &info, sizeof info) == sizeof info) {
                if (info.ssi_signo == SIGCHLD) continue;
                if (!main_child) {
                    unlink(path);
                    return 0;
                }
                kill(main_child, (int)info.ssi_signo); /* it decides; we end when it does */
            }
            int status;
            pid_t done;
            while ((done = waitpid(-1, &status, WNOHANG)) > 0) {
                if (done == main_child) {
                    unlink(path);
                    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                }
                handlers--;
            }
        }
        if (fds[0].revents) {
            int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
            if (conn < 0) continue;
            if (handlers >= MAX_HANDLERS) {
                busy(conn);
                close(conn);
                continue;
            }
            pid_t pid = fork();
            if (pid == 0) {
                close(listener);
                close(signals);
                sigset_t ends;
                sigemptyset(&ends);
                sigaddset(&ends, SIGTERM);
                sigaddset(&ends, SIGINT);
                sigaddset(&ends, SIGHUP);
                sigprocmask(SIG_UNBLOCK, &ends, NULL);
                handle(conn);
                _exit(0);
            }
            if (pid < 0) busy(conn);
            else handlers++;
            close(conn);
        }
    }
}

/* Copy this program to dest (via a temporary name, then rename: never half a binary there). */
static int install(const char *dest) {
    char *parents = strdup(dest);
    if (!parents || (strchr(parents + 1, '/') && make_parents(parents) != 0)) {
        fprintf(stderr, "aenv-exec: cannot make the directories of %s: %s\n", dest, strerror(errno));
        return 1;
    }
    free(parents);
    char temporary[PATH_MAX];
    if (snprintf(temporary, sizeof temporary, "%s.%d.tmp", dest, (int)getpid()) >= PATH_MAX) {
        fprintf(stderr, "aenv-exec: %s is too long a path\n", dest);
        return 1;
    }
    int from = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    int to = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (from < 0 || to < 0) {
        fprintf(stderr, "aenv-exec: cannot copy itself to %s: %s\n", temporary, strerror(errno));
        return 1;
    }
    unsigned char chunk[65536];
    ssize_t got;
    while ((got = read(from, chunk, sizeof chunk)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 || write_all(to, chunk, (size_t)got) != 0) {
            fprintf(stderr, "aenv-exec: cannot copy itself to %s: %s\n", temporary, strerror(errno));
            unlink(temporary);
            return 1;
        }
    }
    if (fchmod(to, 0755) != 0 || close(to) != 0 || rename(temporary, dest) != 0) {
        fprintf(stderr, "aenv-exec: cannot install %s: %s\n", dest, strerror(errno));
        unlink(temporary);
        return 1;
    }
    close(from);
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: aenv-exec --socket PATH [-- COMMAND ARGS...]\n"
                    "       aenv-exec --install DEST\n"
                    "       aenv-exec --version\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        puts(VERSION);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--install")) return install(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "--socket")) {
        if (argc == 3) return serve(argv[2], NULL);
        if (strcmp(argv[3], "--") != 0) return usage();
        return serve(argv[2], argv + 4);
    }
    return usage();
}
